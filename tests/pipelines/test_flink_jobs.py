"""How a bounded run on Flink tells a lost job server from a failed job (``pipelines.flink_jobs``): a job
server is lost when the driver's stream to it dropped (gRPC UNAVAILABLE) or it answers no Job API call; a
connect alone is not enough (a JVM being killed still accepts connections for a moment). The cluster-side
behaviour is tested on a real cluster in tests/flink (test_orphan_jobs, test_beam_on_flink)."""

from __future__ import annotations

import grpc
from apache_beam.runners.portability.local_job_service import LocalJobServicer

from pipelines.flink_jobs import _unavailable, job_server_answers


class _Rpc(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code


def test_a_job_server_that_answers_is_not_lost_and_one_that_stopped_is() -> None:
    servicer = LocalJobServicer()
    port = servicer.start_grpc_server(0)
    try:
        assert job_server_answers(f"127.0.0.1:{port}")
    finally:
        servicer.stop()
    assert not job_server_answers(f"127.0.0.1:{port}", timeout_s=5)
    assert job_server_answers(None)  # Beam started its own (--flink_job_server_jar): nothing to ask


def test_only_a_dropped_stream_counts_as_lost() -> None:
    assert _unavailable(_Rpc(grpc.StatusCode.UNAVAILABLE))
    assert not _unavailable(_Rpc(grpc.StatusCode.INVALID_ARGUMENT))
    assert not _unavailable(RuntimeError("Pipeline job_1 failed in state FAILED: ..."))
