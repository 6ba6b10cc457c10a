"""The streaming shuffler's drain on a Flink cluster (``pipelines.flink_drain``): which runs it applies to, and
that a cluster it cannot reach is a logged warning, not a failed stop. The drain itself runs on a real cluster in
``tests/flink/test_stream_on_cluster.py``."""

from __future__ import annotations

import logging
import socket

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.flink_drain import drain, flink_rest


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
        assert drain(f"127.0.0.1:{port}", "BeamApp-root-0101-abc_123") is False
    assert "flink stop --drain" in caplog.text
