"""`LocalObjectStore`: runs `pipelines.s3server` as a subprocess over a data directory, for tansu's S3 engine.

Layout of `data_dir`: ``objects/<bucket>/...`` (the objects, see `pipelines.objectstore`), ``store.log``,
``endpoint`` (the URL of the server that holds ``.lock``). One server per directory: the server holds an
exclusive flock on ``.lock`` for its lifetime, so a second `start()` on the same directory reuses the running
server instead of racing it, and `stop()` only stops a server this object started.
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import os
import select
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from pipelines.broker import BrokerError

_log = logging.getLogger(__name__)

BUCKET = "tansu"
# The server ignores request signatures (it binds loopback only), but tansu's S3 client insists on keys.
_CLIENT_ENV = {"AWS_ACCESS_KEY_ID": "esa-local", "AWS_SECRET_ACCESS_KEY": "esa-local",
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}


def _answers(url: str, timeout_s: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(urllib.request.Request(f"{url}/{BUCKET}", method="HEAD"),
                                    timeout=timeout_s) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _lock_held(lock_path: Path) -> bool:
    """True when another process (a running server) holds the directory's flock."""
    with lock_path.open("a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
    return False


class LocalObjectStore:
    """The durable object store in `data_dir`, on 127.0.0.1:`port` (None: a free port)."""

    def __init__(self, data_dir: Path, port: int | None = None, *, fsync: bool = True,
                 startup_timeout_s: float = 10.0) -> None:
        self.data_dir = Path(data_dir).resolve()
        self._requested_port = port
        self._fsync = fsync
        self._startup_timeout_s = startup_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._logfile: IO[bytes] | None = None
        self.url: str | None = None
        self.owned = False

    @property
    def log_path(self) -> Path:
        return self.data_dir / "store.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        if self._proc is not None:
            return self._proc.poll() is None
        return self.url is not None and _answers(self.url)

    @property
    def storage_url(self) -> str:
        return f"s3://{BUCKET}/"

    def client_env(self) -> dict[str, str]:
        """Environment for tansu: the endpoint and placeholder credentials (other AWS_* variables are dropped
        so a developer's real AWS profile can never be used against this store, nor this store's keys there)."""
        if self.url is None:
            raise BrokerError("the object store has not been started")
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        return {**env, **_CLIENT_ENV, "AWS_ENDPOINT": self.url}

    def _check_dir(self) -> None:
        try:
            (self.data_dir / "objects").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BrokerError(f"cannot create the durable store directory {self.data_dir}: {exc}") from None
        if not os.access(self.data_dir, os.W_OK | os.X_OK):
            raise BrokerError(f"the durable store directory {self.data_dir} is not writable by uid {os.getuid()}")

    def start(self) -> Self:
        if self.url is not None:
            return self
        self._check_dir()
        lock_path = self.data_dir / ".lock"
        if _lock_held(lock_path):
            endpoint = self.data_dir / "endpoint"
            url = endpoint.read_text().strip() if endpoint.exists() else ""
            if url and _answers(url):
                if self._requested_port is not None and not url.endswith(f":{self._requested_port}"):
                    raise BrokerError(f"{self.data_dir} is already served at {url}, not on port "
                                      f"{self._requested_port}")
                _log.info("reusing the object store already serving %s at %s", self.data_dir, url)
                self.url, self.owned = url, False
                return self
            raise BrokerError(f"another process holds {lock_path} but no store answers at {url or '(unknown)'}; "
                              "is a store for this directory starting or hung?")
        self._launch()
        self.owned = True
        atexit.register(self.stop)
        return self

    def _launch(self) -> None:
        cmd = [sys.executable, "-m", "pipelines.s3server", "--root", str(self.data_dir / "objects"),
               "--port", str(self._requested_port or 0), "--bucket", BUCKET, "--lock", str(self.data_dir / ".lock"),
               "--endpoint-file", str(self.data_dir / "endpoint")]
        if not self._fsync:
            cmd.append("--no-fsync")
        self._logfile = self.log_path.open("ab")
        repo_root = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [repo_root, os.environ.get("PYTHONPATH")]))}
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._logfile,
                                      env=env, start_new_session=True)
        assert self._proc.stdout is not None
        deadline = time.monotonic() + self._startup_timeout_s
        line = b""
        while time.monotonic() < deadline and not line.endswith(b"\n"):
            ready, _, _ = select.select([self._proc.stdout], [], [], 0.1)
            if ready:
                chunk = os.read(self._proc.stdout.fileno(), 256)
                if not chunk:
                    break
                line += chunk
        url = line.decode(errors="replace").strip()
        if not url.startswith("http://") or not _answers(url):
            self._terminate()
            tail = self.log_path.read_text(errors="replace")[-2000:].strip() if self.log_path.exists() else ""
            raise BrokerError(f"the object store for {self.data_dir} did not start"
                              f"{f' on port {self._requested_port}' if self._requested_port else ''}:\n{tail}")
        self.url = url
        _log.info("object store serving %s at %s (pid %s)", self.data_dir, url, self._proc.pid)

    def _terminate(self, grace_s: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(grace_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        if self._logfile is not None:
            self._logfile.close()
            self._logfile = None

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop the server if this object started it (a reused one is left running). Idempotent."""
        if self.owned:
            self._terminate(grace_s)
            atexit.unregister(self.stop)
        self.url, self.owned = None, False

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
