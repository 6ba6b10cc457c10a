"""One local Flink session cluster for the Flink tests, started and stopped by the project's own command
(``deploy/flink/local-cluster``), and the probe job's jar built once. The wheel's jars come from the project's
cache (fetched with pip the first time on a machine, ~300 MB)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines.flink_cluster import LocalFlinkCluster, flink_home
from tests.flink.cluster import build_probe_jar

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "flink" / "local-cluster"


def run_script(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.fixture(scope="session")
def flink_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("flink-cluster")


@pytest.fixture(scope="session")
def flink_cluster(flink_dir: Path) -> Iterator[LocalFlinkCluster]:
    started = run_script("start", str(flink_dir), "--rest-port", "0", "--slots", "2")
    assert started.returncode == 0, started.stderr[-3000:]
    cluster = LocalFlinkCluster(flink_dir)
    try:
        assert started.stdout.splitlines()[-1] == cluster.rest
        yield cluster
    finally:
        stopped = run_script("stop", str(flink_dir), timeout=120)
        assert stopped.returncode == 0, stopped.stderr


@pytest.fixture(scope="session")
def probe_jar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_probe_jar(flink_home(), tmp_path_factory.mktemp("probe"))
