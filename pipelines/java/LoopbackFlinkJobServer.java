// Beam's FlinkJobServerDriver (Beam 2.62, Flink 1.19) with its gRPC servers bound to --job-host only.
//
// Why: Beam's default ServerFactory builds every server with NettyServerBuilder.forPort(port), which listens on
// all interfaces whatever --job-host says; a job server accepts pipelines (code) from anyone who reaches it.
// This driver is FlinkJobServerDriver's own main() with one difference: a ServerFactory that binds the address
// it is given. Port 0 picks a free port; the chosen address is logged ("JobService started on HOST:PORT").
// The expansion service is not started here (--expansion-port -1): it would bind all interfaces.
import java.io.IOException;
import java.net.InetSocketAddress;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.apache.beam.model.pipeline.v1.Endpoints;
import org.apache.beam.runners.flink.FlinkJobInvoker;
import org.apache.beam.runners.flink.FlinkJobServerDriver;
import org.apache.beam.runners.jobsubmission.JobServerDriver;
import org.apache.beam.sdk.extensions.gcp.options.GcsOptions;
import org.apache.beam.sdk.fn.server.GrpcContextHeaderAccessorProvider;
import org.apache.beam.sdk.fn.server.ServerFactory;
import org.apache.beam.sdk.io.FileSystems;
import org.apache.beam.sdk.options.PipelineOptions;
import org.apache.beam.sdk.options.PipelineOptionsFactory;
import org.apache.beam.vendor.grpc.v1p60p1.io.grpc.BindableService;
import org.apache.beam.vendor.grpc.v1p60p1.io.grpc.Server;
import org.apache.beam.vendor.grpc.v1p60p1.io.grpc.ServerInterceptors;
import org.apache.beam.vendor.grpc.v1p60p1.io.grpc.netty.NettyServerBuilder;

public class LoopbackFlinkJobServer extends JobServerDriver {

  /** Binds exactly the host it is given (Beam's default binds the wildcard address). */
  static final class BoundServerFactory extends ServerFactory {
    private final String host;

    BoundServerFactory(String host) {
      this.host = host;
    }

    @Override
    public Server allocateAddressAndCreate(
        List<BindableService> services, Endpoints.ApiServiceDescriptor.Builder descriptor) throws IOException {
      Server server = build(services, new InetSocketAddress(host, 0));
      descriptor.setUrl(host + ":" + server.getPort());
      return server;
    }

    @Override
    public Server create(List<BindableService> services, Endpoints.ApiServiceDescriptor descriptor)
        throws IOException {
      String url = descriptor.getUrl();
      int colon = url.lastIndexOf(':');
      return build(services, new InetSocketAddress(url.substring(0, colon), Integer.parseInt(url.substring(colon + 1))));
    }

    private static Server build(List<BindableService> services, InetSocketAddress address) throws IOException {
      NettyServerBuilder builder =
          NettyServerBuilder.forAddress(address)
              .maxInboundMessageSize(Integer.MAX_VALUE)
              .permitKeepAliveTime(20, TimeUnit.SECONDS);
      for (BindableService service : services) {
        builder.addService(ServerInterceptors.intercept(service, GrpcContextHeaderAccessorProvider.interceptor()));
      }
      return builder.build().start();
    }
  }

  private LoopbackFlinkJobServer(FlinkJobServerDriver.FlinkServerConfiguration configuration) {
    super(configuration, new BoundServerFactory(configuration.getHost()),
        new BoundServerFactory(configuration.getHost()), () -> FlinkJobInvoker.create(configuration));
  }

  public static void main(String[] args) throws Exception {
    PipelineOptions options = PipelineOptionsFactory.create();
    options.as(GcsOptions.class).setGcsUploadBufferSizeBytes(1024 * 1024);
    FileSystems.setDefaultPipelineOptions(options);
    new LoopbackFlinkJobServer(FlinkJobServerDriver.parseArgs(args)).run();
  }
}
