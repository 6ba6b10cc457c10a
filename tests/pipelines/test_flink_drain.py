"""The streaming shuffler's drain on a Flink cluster (``pipelines.flink_drain``): which runs it applies to, and
that a cluster it cannot reach is a logged warning, not a failed stop. The drain itself runs on a real cluster in
``tests/flink/test_stream_on_cluster.py``."""

from __future__ import annotations

import json
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.flink_drain import drain, drain_failure, flink_rest


@pytest.mark.parametrize("argv,expected", [
    (["--runner", "FlinkRunner", "--flink_master", "127.0.0.1:8081"], "127.0.0.1:8081"),
    (["--runner", "FlinkRunner", "--flink_master", "http://jm.example:8081/"], "jm.example:8081"),
    (["--runner", "FlinkRunner", "--flink_master", "[local]"], None),  # embedded in the job server: no cluster
    (["--runner", "FlinkRunner"], None),  # [auto]
    (["--runner", "PrismRunner", "--flink_master", "127.0.0.1:8081"], None),
    ([], None),
])
def test_only_a_flink_cluster_is_drained(argv: list[str], expected: str | None) -> None:
    assert flink_rest(PipelineOptions(argv)) == expected


def test_an_unreachable_cluster_is_a_warning_not_a_failed_stop(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as probe:  # a free port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with caplog.at_level(logging.WARNING, logger="esa.flink_drain"):
        assert drain(f"127.0.0.1:{port}", "BeamApp-root-0101-abc_123") is None
    assert "flink stop --drain" in caplog.text


def test_a_drain_the_job_refused_is_told_from_one_still_running_or_done() -> None:
    """Flink answers a refused stop-with-savepoint as COMPLETED with a failure cause (measured: a resumed job
    still restoring, "Not all required tasks are currently running"); the driver asks again only then."""
    answers = {
        "refused": {"status": {"id": "COMPLETED"}, "operation": {"failure-cause": {
            "class": "java.util.concurrent.CompletionException",
            "stack-trace": "CheckpointException: Not all required tasks are currently running.\n\tat x"}}},
        "running": {"status": {"id": "IN_PROGRESS"}},
        "done": {"status": {"id": "COMPLETED"}, "operation": {"location": "file:/savepoints/savepoint-1"}},
    }

    class Flink(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # /jobs/<jid>/savepoints/<request>
            body = json.dumps(answers[self.path.rsplit("/", 1)[1]]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Flink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    rest = f"127.0.0.1:{server.server_address[1]}"
    try:
        refused = drain_failure(rest, "j", "refused")
        assert refused == "CheckpointException: Not all required tasks are currently running."
        assert drain_failure(rest, "j", "running") is None
        assert drain_failure(rest, "j", "done") is None
    finally:
        server.shutdown()
