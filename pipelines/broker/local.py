"""A single-node Apache Kafka (KRaft, combined broker + controller) on loopback, started from its own jars.

Why a subprocess wrapper: tests, benchmarks, the demo and `esa broker` need the real broker -- its
transactions, fencing, retention, authentication and ACLs are where this project's guarantees live -- and a
harness needs around it: the jars (fetched once, see `jars`), formatted storage, a free port, a log kept for
post-mortems, readiness checked with a real client (an open port is not enough), and a shutdown that cannot
hang. ``data_dir`` keeps topics, records and committed offsets across stops, restarts and SIGKILLs (Kafka
writes to the page cache and recovers its logs on start); without it a temporary directory is used and
removed on `stop`.
"""

from __future__ import annotations

import atexit
import base64
import logging
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from pipelines.broker.errors import BrokerError
from pipelines.broker.jars import KAFKA_VERSION, java_binary, kafka_jars
from pipelines.broker.properties import LOG4J2_YAML, SaslSsl, server_properties

_log = logging.getLogger(__name__)


def free_loopback_port() -> int:
    """A port that was free a moment ago; a start on it retries if another process grabs it first."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_free(port: int) -> bool:
    """Checked before launch, so a taken port is named as such instead of a start-up time-out."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is fine, a listener is not
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _terminate_with_parent() -> None:
    """In the child before exec: ask Linux to SIGTERM it when the thread that started it ends."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def parent_death_hook() -> Callable[[], None] | None:
    """The ``preexec_fn`` that ties a broker to this process: `_terminate_with_parent` on the main thread only.

    Why: Linux sends the parent-death signal when the *thread* that forked the child ends, not the process. A
    broker started from a worker thread (a timer in a test, a restart done by a helper thread) was SIGTERMed as
    soon as that thread returned: it joined the cluster, then stopped 2 s later with nothing in its log to say
    why. The main thread lives as long as the process, so there the signal means what it should."""
    return _terminate_with_parent if threading.current_thread() is threading.main_thread() else None


def _cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding (Kafka's `Uuid` text form)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):  # kafka-storage reads a leading '-' as an option
            return text


def _serving(metadata: Any) -> bool:
    """The broker is registered and leads every partition it holds: after a restart, the log recovery and
    leader election end some time after the first metadata answer, and a client served before would be
    told "not leader" for a partition it just read."""
    if not metadata.brokers:
        return False
    return all(t.error is None and all(p.leader >= 0 and p.error is None for p in t.partitions.values())
               for t in metadata.topics.values())


class LocalBroker:
    """Apache Kafka on 127.0.0.1; use as a context manager (or `start` / `stop`).

    ``port=None`` picks a free port (retried if stolen). ``data_dir`` holds ``kafka-logs/`` (the log),
    ``server.properties`` and ``broker.log``; given, it survives `stop` and a later broker on it carries on.
    ``security`` adds a SASL_SSL listener with ACLs (see `SaslSsl`); ``properties`` overrides broker settings
    (retention, quotas). ``heap`` is the JVM's maximum heap.
    """

    def __init__(self, port: int | None = None, *, data_dir: Path | None = None, security: SaslSsl | None = None,
                 properties: Mapping[str, str] | None = None, startup_timeout_s: float = 90.0,
                 heap: str = "768m", keep_log: bool = False, version: str = KAFKA_VERSION) -> None:
        self._requested_port = port
        self._data_dir = Path(data_dir).resolve() if data_dir is not None else None
        self.security = security
        self._properties = dict(properties or {})
        self._startup_timeout_s = startup_timeout_s
        self._heap = heap
        self._keep_log = keep_log
        self._version = version
        self._proc: subprocess.Popen[bytes] | None = None
        self._logfile: IO[bytes] | None = None
        self._tmpdir: Path | None = None
        self._java: str | None = None
        self._jars: Path | None = None
        self.dir: Path | None = None
        self.port: int | None = None
        self.log_path: Path | None = None

    @property
    def bootstrap(self) -> str:
        if self.port is None:
            raise BrokerError("the broker has not been started")
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def client_config(self, user: str | None = None, password: str | None = None) -> dict[str, str]:
        """librdkafka settings that reach this broker (as ``user`` on a secured one; the admin by default)."""
        if self.security is None:
            return {}
        return self.security.client_config(user, password) if user else self.security.client_config()

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the broker log, for error messages."""
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        with self.log_path.open(errors="replace") as fh:
            return "".join(deque(fh, maxlen=lines)).rstrip() or "(empty log)"

    def start(self) -> Self:
        if self._proc is not None:
            return self
        self._java = java_binary()
        self._jars = kafka_jars(self._version)
        if self._requested_port is not None and not port_free(self._requested_port):
            raise BrokerError(f"port {self._requested_port} on 127.0.0.1 is already in use")
        if self._data_dir is None:
            self._tmpdir = Path(tempfile.mkdtemp(prefix="esa-kafka-"))
        self.dir = self._data_dir or self._tmpdir
        assert self.dir is not None
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BrokerError(f"cannot create the broker's data directory {self.dir}: {exc.strerror}") from None
        self.log_path = self.dir / "broker.log"
        attempts = 1 if self._requested_port is not None else 3
        for attempt in range(1, attempts + 1):
            self.port = self._requested_port or free_loopback_port()
            try:
                self._launch()
                self._wait_ready()
            except BrokerError as exc:
                early_exit = self._proc is not None and self._proc.poll() is not None
                self._terminate(0.0)
                if early_exit and attempt < attempts and "Address already in use" in self.log_tail(60):
                    _log.warning("port %s was taken during start-up; retrying on another", self.port)
                    continue
                tail = self.log_tail()  # the directory is kept: the message quotes its log
                self._tmpdir = None
                raise BrokerError(f"{exc} (log: {self.log_path})", detail=tail) from None
            break
        atexit.register(self.stop)
        _log.info("Apache Kafka %s ready on %s (pid %s, data %s)", self._version, self.bootstrap, self.pid, self.dir)
        return self

    def _launch(self) -> None:
        assert self.dir is not None and self._java is not None and self._jars is not None and self.port
        config = self.dir / "server.properties"
        log_dir = self.dir / "kafka-logs"
        # the controller's port is private to this node; a fresh one each start is fine (static quorum)
        config.write_text(server_properties(port=self.port, controller_port=free_loopback_port(), log_dir=log_dir,
                                            security=self.security, extra=self._properties))
        (self.dir / "log4j2.yaml").write_text(LOG4J2_YAML)
        classpath = f"{self._jars}/*"
        if not (log_dir / "meta.properties").exists():
            self._format(classpath, config)
        cmd = [self._java, f"-Xmx{self._heap}", "-Xms128m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
               "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={self.dir / 'log4j2.yaml'}",
               "-cp", classpath, "kafka.Kafka", str(config)]
        self._logfile = self.log_path.open("ab") if self.log_path else None
        _log.debug("starting %s", " ".join(cmd))
        # Own session: a Ctrl-C in the terminal reaches only us, and we stop the broker in order. If we die
        # without stopping it (SIGKILL, a SIGTERM that skips atexit), the kernel sends it SIGTERM: no JVM is left
        # (started from the main thread; see `parent_death_hook`).
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._logfile, stderr=subprocess.STDOUT,
                                      cwd=self.dir, start_new_session=True, preexec_fn=parent_death_hook())

    def _format(self, classpath: str, config: Path) -> None:
        assert self._java is not None
        cmd = [self._java, "-cp", classpath, f"-Dlog4j2.configurationFile={self.dir / 'log4j2.yaml'}",
               "kafka.tools.StorageTool", "format", "--cluster-id", _cluster_id(), "--config", str(config),
               *(self.security.scram_arguments() if self.security else [])]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise BrokerError(f"kafka-storage format failed: {(done.stderr or done.stdout).strip()[-500:]}")

    def _wait_ready(self) -> None:
        from confluent_kafka.admin import AdminClient

        assert self._proc is not None
        deadline = time.monotonic() + self._startup_timeout_s
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0, **self.client_config()})
        while time.monotonic() < deadline:
            code = self._proc.poll()
            if code is not None:
                raise BrokerError(f"Apache Kafka exited with code {code} before serving {self.bootstrap}")
            try:
                if admin.list_topics(timeout=1.0).brokers:
                    return
            except Exception:
                time.sleep(0.1)
        raise BrokerError(f"Apache Kafka did not answer metadata requests on {self.bootstrap} within "
                          f"{self._startup_timeout_s:.0f} s")

    def kill(self) -> None:
        """SIGKILL the broker (a crash, for durability tests); `restart` brings it back on the same data."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait()

    def restart(self) -> Self:
        """Stop the broker (SIGTERM, or reap it if it was killed) and start it on the same port and data."""
        if self.port is None or self.dir is None:
            raise BrokerError("restart() before start()")
        self._terminate()
        deadline = time.monotonic() + 30.0
        while not port_free(self.port) and time.monotonic() < deadline:
            time.sleep(0.1)
        try:
            self._launch()
            self._wait_ready()
        except BrokerError as exc:
            self._terminate(0.0)
            raise BrokerError(f"{exc} (log: {self.log_path})", detail=self.log_tail()) from None
        _log.info("Apache Kafka restarted on %s", self.bootstrap)
        return self

    def _terminate(self, grace_s: float = 30.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                _log.warning("Apache Kafka did not exit within %.0f s of SIGTERM; killing it", grace_s)
                proc.kill()
                proc.wait()
        if self._logfile is not None:
            self._logfile.close()
            self._logfile = None

    def _cleanup(self) -> None:
        if self._tmpdir is not None and not self._keep_log:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
        self._tmpdir = None

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM and wait (SIGKILL after ``grace_s``); a temporary data directory is removed. Idempotent."""
        self._terminate(grace_s)
        atexit.unregister(self.stop)
        self._cleanup()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

