"""Beam's Flink job server (Beam 2.62.0, Flink 1.19) assembled from Maven, started and stopped by the project.

Beam's shaded ``beam-runners-flink-<v>-job-server`` jars are not served where this project runs; the unshaded
runner (``beam-runners-flink-1.19:2.62.0``, which holds ``FlinkJobServerDriver``) and
``beam-runners-java-job-service:2.62.0`` are, with all their dependencies. ``mvn dependency:copy-dependencies``
puts them in the cache once (``pipelines.artifacts.maven_classpath``: locked, renamed into place, no network
afterwards), and ``LoopbackFlinkJobServer.java`` (Beam's driver with servers bound to ``--job-host`` only;
Beam's own binds every interface) is compiled against them once.

Process shape (no JVM outlives its owner): the submitting process starts a watchdog, ``python -m
pipelines.flink_job_server --flink-master H:P --watch-stdin``, holding the write end of its stdin. The watchdog
starts the JVM with ``PR_SET_PDEATHSIG=SIGKILL`` (the kernel kills the JVM when the watchdog dies, even by
SIGKILL), prints ``JOB_ENDPOINT HOST:PORT JVM_PID`` once the Job API listens, and stops the JVM when its stdin
reaches end of file (the owner exited, however it died), on SIGTERM/SIGINT, or exits when the JVM does.
Operators can run the same command by hand (without ``--watch-stdin``; Ctrl+C stops it).

API (stable; the streaming helpers use it): ``JobServer(flink_master).start() -> "127.0.0.1:PORT"``,
``.stop()``, ``.jvm_pid``, ``.watchdog_pid``, ``.log_path``; ``shared_job_server(flink_master)`` is the one
per process that ``esa ... --runner FlinkRunner --flink_master H:P`` starts when given no ``--job_endpoint``
(stopped at exit).
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from pipelines.artifacts import compiled_java, maven_classpath

BEAM_VERSION = "2.62.0"  # the newest Beam whose Flink runner and Java job service are both served (Flink 1.19)
FLINK_MINOR = "1.19"
COORDINATES = (f"org.apache.beam:beam-runners-flink-{FLINK_MINOR}:{BEAM_VERSION}",
               f"org.apache.beam:beam-runners-java-job-service:{BEAM_VERSION}",
               "org.slf4j:slf4j-simple:1.7.30")  # the runner logs through SLF4J 1.7.30; without a binding, nothing
MAIN = "LoopbackFlinkJobServer"
SOURCE = Path(__file__).resolve().parent / "java" / f"{MAIN}.java"
HOST = "127.0.0.1"
JAVA_OPTS = ("--add-opens=java.base/java.lang=ALL-UNNAMED", "--add-opens=java.base/java.util=ALL-UNNAMED",
             "--add-opens=java.base/java.nio=ALL-UNNAMED", "--add-opens=java.base/java.lang.invoke=ALL-UNNAMED",
             "-Dorg.slf4j.simpleLogger.showDateTime=true",
             "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd HH:mm:ss,SSS")
STARTED = re.compile(r"JobService started on (\S+)")
PR_SET_PDEATHSIG = 1
START_TIMEOUT_S = 300.0  # a JVM with 160 jars on a loaded 2-core machine
STOP_GRACE_S = 15.0


def classpath(extra_libs: str = "") -> str:
    """The job server's class path: the compiled launcher, then every jar (fetched/compiled on first use),
    then the jars in ``extra_libs`` (Java KafkaIO's, for ``--kafka_io xlang``: its EMBEDDED harness runs here)."""
    libs = maven_classpath(f"flink-job-server-{BEAM_VERSION}-flink-{FLINK_MINOR}", COORDINATES)
    classes = compiled_java(SOURCE, libs, f"flink-job-server-launcher-{BEAM_VERSION}")
    path = f"{classes}{os.pathsep}{libs}{os.sep}*"
    return f"{path}{os.pathsep}{extra_libs}{os.sep}*" if extra_libs else path


def java_command(flink_master: str, artifacts_dir: Path, extra_libs: str = "") -> list[str]:
    java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else "java"
    return [java, *JAVA_OPTS, "-cp", classpath(extra_libs), MAIN, f"--flink-master={flink_master}",
            f"--job-host={HOST}", "--job-port=0", "--artifact-port=0", "--expansion-port=-1",
            f"--artifacts-dir={artifacts_dir}"]


def _die_with_parent() -> None:
    """In the child before exec: the kernel sends SIGKILL when the (single-threaded) watchdog dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:  # the watchdog died before prctl took effect
        os._exit(1)


class JobServer:
    """One job server for ``flink_master``, owned by this process (see the module's docstring)."""

    def __init__(self, flink_master: str, work_dir: str | os.PathLike[str] | None = None,
                 extra_libs: str | os.PathLike[str] = "") -> None:
        self.flink_master = flink_master
        self.extra_libs = str(extra_libs or "")
        self._own_dir = work_dir is None
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="esa-flink-job-server-"))
        self.endpoint = ""
        self.jvm_pid = 0
        self._watchdog: subprocess.Popen[str] | None = None

    @property
    def log_path(self) -> Path:
        return self.work_dir / "job-server.log"

    @property
    def watchdog_pid(self) -> int:
        return self._watchdog.pid if self._watchdog else 0

    def start(self, timeout_s: float = START_TIMEOUT_S) -> str:
        """Start it; ``HOST:PORT`` of its Job API once it listens (RuntimeError with its log's cause if not)."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        classpath(self.extra_libs)  # fetch/compile here, in this process: errors surface as ArtifactUnavailableError
        self._watchdog = subprocess.Popen(
            [sys.executable, "-m", "pipelines.flink_job_server", "--flink-master", self.flink_master,
             "--work-dir", str(self.work_dir), "--watch-stdin",
             *(["--extra-libs", self.extra_libs] if self.extra_libs else [])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(SOURCE.parents[2]),
                                                                          os.environ.get("PYTHONPATH")]))))
        line = _readline(self._watchdog, timeout_s)
        found = re.match(r"JOB_ENDPOINT (\S+) (\d+)$", line)
        if not found:
            error = (self._watchdog.stderr.read() if self._watchdog.poll() is not None and self._watchdog.stderr
                     else "") or line
            self.stop()
            raise RuntimeError(f"Flink job server did not start: {error.strip()[-400:] or 'no output'} "
                               f"(log: {self.log_path})")
        self.endpoint, self.jvm_pid = found.group(1), int(found.group(2))
        return self.endpoint

    def alive(self) -> bool:
        return self._watchdog is not None and self._watchdog.poll() is None

    def stop(self, grace_s: float = STOP_GRACE_S + 10) -> None:
        """Close the watchdog's stdin (it stops the JVM) and wait for it; SIGKILL it if it does not exit."""
        watchdog, self._watchdog = self._watchdog, None
        stop_watchdog(watchdog, grace_s)
        if self._own_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)


def stop_watchdog(watchdog: subprocess.Popen[str] | None, grace_s: float) -> None:
    """Close a JVM watchdog's stdin (it stops the JVM) and wait for it; SIGKILL it if it does not exit."""
    if watchdog is None:
        return
    try:
        if watchdog.stdin:
            watchdog.stdin.close()
    except OSError:
        pass
    try:
        watchdog.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        watchdog.kill()  # the JVM follows it (PDEATHSIG)
        watchdog.wait(timeout=grace_s)


def _readline(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """The watchdog's first stdout line, or "" after ``timeout_s`` or its exit."""
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline() if proc.stdout else ""), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return box[0].strip() if box else ""


_SHARED: dict[str, JobServer] = {}
_SHARED_LOCK = threading.Lock()


def shared_job_server(flink_master: str, extra_libs: str | os.PathLike[str] = "") -> JobServer:
    """This process's job server for ``flink_master``, started on first use and stopped at exit."""
    with _SHARED_LOCK:
        key = f"{flink_master} {extra_libs}" if extra_libs else flink_master
        server = _SHARED.get(key)
        if server is None or not server.alive():
            server = JobServer(flink_master, extra_libs=extra_libs)
            server.start()
            if not _SHARED:
                atexit.register(stop_shared_job_servers)
            _SHARED[key] = server
        return server


def stop_shared_job_servers() -> None:
    with _SHARED_LOCK:
        for server in _SHARED.values():
            server.stop()
        _SHARED.clear()


# -- the watchdog -----------------------------------------------------------------------------------------
def serve(flink_master: str, work_dir: Path, watch_stdin: bool, extra_libs: str = "") -> int:
    """Run the JVM until the owner goes (stdin EOF), a signal comes, or the JVM exits; its exit code."""
    work_dir.mkdir(parents=True, exist_ok=True)
    (work_dir / "artifacts").mkdir(exist_ok=True)
    log_path = work_dir / "job-server.log"
    command = java_command(flink_master, work_dir / "artifacts", extra_libs)

    def failure(jvm: subprocess.Popen[bytes], text: str) -> str:
        causes = re.findall(r"(?:Caused by: |ERROR |Exception: )(.*)", text)
        return (f"the job server JVM {'exited' if jvm.returncode else 'did not start'}: "
                f"{(causes[-1] if causes else text.strip().splitlines()[-1:] or ['no output'])}")

    return watch_jvm(command, log_path, STARTED, "JOB_ENDPOINT", failure, watch_stdin)


def watch_jvm(command: list[str], log_path: Path, started: re.Pattern[str], marker: str,
              failure: Callable[[subprocess.Popen[bytes], str], str], watch_stdin: bool) -> int:
    """The watchdog of one JVM service (this job server, the KafkaIO expansion service): start it logging to
    ``log_path``, print ``MARKER endpoint pid`` once ``started`` matches its log, then run it until the owner
    goes (stdin EOF), a signal comes, or the JVM exits; its exit code. A JVM that never started is one line
    on stderr (``failure`` of the JVM and its log) and exit 1."""
    with open(log_path, "ab") as log:
        jvm = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               preexec_fn=_die_with_parent)
    stopping = False

    def _stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    deadline, endpoint = time.monotonic() + START_TIMEOUT_S, ""
    while not endpoint and not stopping and jvm.poll() is None and time.monotonic() < deadline:
        found = started.search(log_path.read_text(errors="replace"))
        endpoint = found.group(1) if found else ""
        time.sleep(0.2)
    if not endpoint:
        _terminate(jvm)
        print(failure(jvm, log_path.read_text(errors="replace")), file=sys.stderr)
        return 1
    print(f"{marker} {endpoint} {jvm.pid}", flush=True)
    while not stopping and jvm.poll() is None:
        if watch_stdin:
            readable, _, _ = select.select([sys.stdin], [], [], 0.5)
            if readable and not os.read(sys.stdin.fileno(), 4096):
                break  # end of file: the owner closed it or died
        else:
            time.sleep(0.5)
    return _terminate(jvm)


def _terminate(jvm: subprocess.Popen[bytes]) -> int:
    if jvm.poll() is None:
        jvm.terminate()
        try:
            jvm.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            jvm.kill()
            jvm.wait()
    return 0 if jvm.returncode in (0, -signal.SIGTERM, 143) else int(jvm.returncode or 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flink-job-server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--flink-master", required=True, help="HOST:PORT of the Flink REST API, or [local]")
    parser.add_argument("--work-dir", type=Path, help="log and staged artifacts (default: a new temp directory)")
    parser.add_argument("--watch-stdin", action="store_true", help="stop when stdin reaches end of file")
    parser.add_argument("--extra-libs", default="", help="a directory of jars added to the class path")
    args = parser.parse_args(argv)
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="esa-flink-job-server-"))
    return serve(args.flink_master, work_dir, args.watch_stdin, args.extra_libs)


if __name__ == "__main__":
    sys.exit(main())
