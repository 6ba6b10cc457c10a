"""An ``esa edge`` process for tests: started on a free port, its log kept, stopped or SIGKILLed by PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from transforms.io.kafka.bounded import read_topic

REPO = Path(__file__).resolve().parents[2]


class EdgeProcess:
    def __init__(self, bootstrap: str, keys_dir: Path, spool_dir: Path, log: Path, *extra: str) -> None:
        self.args = [sys.executable, "-m", "pipelines.cli", "edge", "--kafka_bootstrap", bootstrap, "--keys_dir",
                     str(keys_dir), "--spool_dir", str(spool_dir), "--port", "0", *extra]
        self.log = log
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self, timeout_s: float = 120.0) -> EdgeProcess:
        log = open(self.log, "a")  # noqa: SIM115 (kept open for the child's life)
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=log, text=True, cwd=REPO,
                                     env={**os.environ, "PYTHONPATH": str(REPO)})
        found: list[str] = []

        def watch() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                if "listening on" in line:
                    found.append(line.split("listening on", 1)[1].strip())
                with open(self.log, "a") as out:
                    out.write(line)

        threading.Thread(target=watch, daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while not found:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"esa edge did not start (exit {self.proc.poll()}):\n{self.log.read_text()}")
            time.sleep(0.05)
        self.url = found[0]
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)

    def __enter__(self) -> EdgeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.stop()


def topic_values(bootstrap: str, topic: str) -> list[bytes]:
    return [r.value for r in topic_records(bootstrap, topic)]


def topic_records(bootstrap: str, topic: str) -> list:
    return list(read_topic(bootstrap, topic))


def wait_for(condition, timeout_s: float = 120.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)
