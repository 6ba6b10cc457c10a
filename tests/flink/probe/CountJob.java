// A Flink job for testing the local cluster itself (not Beam): numbers 1..N, slowed down so that a failure
// test can kill a TaskManager while it runs, written by an exactly-once FileSink (files committed on
// checkpoints). After any number of restarts from checkpoints the output holds each number exactly once.
// Arguments: N OUT SLEEP_MS_PER_THOUSAND [JOB_NAME].
import org.apache.flink.api.common.serialization.SimpleStringEncoder;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.connector.file.sink.FileSink;
import org.apache.flink.core.fs.Path;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;

public class CountJob {
    public static void main(String[] args) throws Exception {
        long n = Long.parseLong(args[0]);
        String out = args[1];
        long sleepMsPerThousand = Long.parseLong(args[2]);
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment();
        env.enableCheckpointing(300);
        env.fromSequence(1, n)
            .map(x -> {
                if (x % 1000 == 0) {
                    Thread.sleep(sleepMsPerThousand);
                }
                return Long.toString(x);
            })
            .returns(Types.STRING)
            .sinkTo(FileSink.forRowFormat(new Path(out), new SimpleStringEncoder<String>()).build());
        env.execute(args.length > 3 ? args[3] : "esa-cluster-probe");  // a name: tests of jobs found by name
    }
}
