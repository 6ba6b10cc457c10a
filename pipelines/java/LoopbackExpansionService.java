// Beam's Java expansion service (Beam 2.62) bound to one address, for Java's KafkaIO (--kafka_io xlang).
//
// Why not ExpansionService.main: it listens with ServerBuilder.forPort, on every interface; an expansion service
// turns requests into Java code the runner will execute. ExpansionServer.create binds the host it is given and
// serves the artifact retrieval service beside it (the SDK fetches the Java environment's jars from it).
// Arguments: HOST PORT [pipeline options, e.g. --defaultEnvironmentType=EMBEDDED]. Port 0 picks a free port;
// the chosen address is printed ("ExpansionService started on HOST:PORT"). Stops on SIGTERM.
import org.apache.beam.sdk.expansion.service.ExpansionServer;
import org.apache.beam.sdk.expansion.service.ExpansionService;
import org.apache.beam.sdk.expansion.service.ExpansionServiceOptions;
import org.apache.beam.sdk.options.PipelineOptions;
import org.apache.beam.sdk.options.PipelineOptionsFactory;

public class LoopbackExpansionService {
  public static void main(String[] args) throws Exception {
    String host = args[0];
    int port = Integer.parseInt(args[1]);
    String[] rest = java.util.Arrays.copyOfRange(args, 2, args.length);
    PipelineOptionsFactory.register(ExpansionServiceOptions.class);
    PipelineOptions options = PipelineOptionsFactory.fromArgs(rest).create();
    ExpansionService service = new ExpansionService(options, host);
    ExpansionServer server = ExpansionServer.create(service, host, port);
    System.out.println("ExpansionService started on " + server.getHost() + ":" + server.getPort());
    System.out.flush();
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      try {
        server.close();
      } catch (Exception e) {
        // the JVM is exiting anyway
      }
    }));
    Thread.currentThread().join();
  }
}
