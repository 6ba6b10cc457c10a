"""Runner plumbing for the portable-runner tests: Beam's local job service, an external SDK worker pool,
and the pipeline options that point a job at them.

Kept apart from the test so the job API (``pipelines.end_to_end.run(config, options)``) can change in one
place. The local job service is the same gRPC Job API that a Flink job server exposes; a worker pool
started with ``worker_pool_main`` is the EXTERNAL environment Flink and Dataflow use for separate SDK
worker processes.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from apache_beam.options.pipeline_options import PipelineOptions

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A loopback TCP port that was free a moment ago (the child binds it; a race is possible but rare)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child_env() -> dict[str, str]:
    """The environment of a child Python: this checkout first on its path, this interpreter first on PATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    # The worker pool starts each SDK worker as ``python -c ...``: that must be this interpreter (with Beam).
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def _wait_for_port(port: int, proc: subprocess.Popen, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited early with code {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"{what} did not listen on port {port} within {timeout_s:.0f} s")


@contextmanager
def _service(args: list[str], what: str, log_path: Path) -> Iterator[str]:
    """Start ``python -m MODULE --port``-style service as a child; yield its address; stop it by its pid."""
    port = free_port()
    cmd = [sys.executable, "-m", *[a.format(port=port) for a in args]]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, env=_child_env(), stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
        try:
            _wait_for_port(port, proc, what)
            yield f"localhost:{port}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@contextmanager
def local_job_service(log_dir: Path) -> Iterator[str]:
    """Beam's Python job service (``local_job_service_main``): the Job API that Flink's job server serves."""
    with _service(["apache_beam.runners.portability.local_job_service_main", "--port={port}"],
                  "local job service", log_dir / "job_service.log") as address:
        yield address


@contextmanager
def worker_pool(log_dir: Path) -> Iterator[str]:
    """A Python SDK worker pool (``worker_pool_main``): each bundle runs in a separate worker process."""
    with _service(["apache_beam.runners.worker.worker_pool_main", "--service_port={port}"],
                  "SDK worker pool", log_dir / "worker_pool.log") as address:
        yield address


def portable_options(job_endpoint: str, environment_type: str = "LOOPBACK",
                     environment_config: str | None = None, extra: Sequence[str] = ()) -> PipelineOptions:
    """Options that send a job to ``job_endpoint`` with the given SDK harness environment (plus ``extra``
    flags, which reach the SDK workers too: an object store's endpoint and credentials, for example)."""
    args = ["--runner=PortableRunner", f"--job_endpoint={job_endpoint}", f"--environment_type={environment_type}"]
    if environment_config:
        args.append(f"--environment_config={environment_config}")
    return PipelineOptions([*args, *extra])
