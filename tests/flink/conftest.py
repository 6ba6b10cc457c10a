"""What the Flink suite shares, made once per session: one local Flink 1.19.3 session cluster started and
stopped by the project's own command (``deploy/flink/local-cluster``), the Beam 2.62.0 environment
(``deploy/flink/env``), one job server assembled from Maven, and the probe job's jar. Everything is fetched
into the project's cache the first time on a machine (the Flink sdist ~230 MB with pip, the job server's jars
~150 MB with mvn, the environment with pip) and reused offline afterwards."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines.flink_cluster import LocalFlinkCluster, flink_home
from pipelines.flink_job_server import JobServer
from tests.flink.cluster import build_probe_jar

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "flink" / "local-cluster"
ENV_SCRIPT = REPO / "deploy" / "flink" / "env"


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


@pytest.fixture(scope="session")
def flink_env() -> Path:
    """The Beam 2.62.0 environment with this checkout (created once per machine, minutes on a cold cache)."""
    made = subprocess.run([str(ENV_SCRIPT)], capture_output=True, text=True, timeout=3600, cwd=REPO)
    assert made.returncode == 0, made.stderr[-3000:]
    return Path(made.stdout.splitlines()[-1])


@pytest.fixture(scope="session")
def harness_options(flink_env: Path) -> list[str]:
    """SDK harnesses as processes the TaskManagers start from the 2.62.0 environment (not LOOPBACK)."""
    command = json.dumps({"command": str(flink_env / "bin" / "esa-sdk-harness")})
    return ["--environment_type=PROCESS", f"--environment_config={command}"]


@pytest.fixture(scope="session")
def _job_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, JobServer]]:
    """The job servers of this session by the cluster address they submit to (at most one alive)."""
    servers: dict[str, JobServer] = {}
    try:
        yield servers
    finally:
        for server in servers.values():
            server.stop()


@pytest.fixture
def job_server(flink_cluster: LocalFlinkCluster, _job_servers: dict[str, JobServer],
               tmp_path_factory: pytest.TempPathFactory) -> JobServer:
    """One job server for the cluster, shared by the tests that pass ``--job_endpoint``. A job server is bound
    to the REST address it was started with: the savepoint test restarts the cluster, which comes back on
    another port, so a server for the old address is stopped and one for the new address started (a stale one
    submits to a cluster that is gone, and the job never starts)."""
    rest = flink_cluster.rest
    if rest not in _job_servers:
        for stale in _job_servers.values():
            stale.stop()
        _job_servers.clear()
        server = JobServer(rest, tmp_path_factory.mktemp("job-server"))
        server.start()
        _job_servers[rest] = server
    return _job_servers[rest]
