"""Every command that talks to Kafka says so in one line and exits 4 when the broker cannot be reached or the
topic it reads is missing: no traceback, nothing created (the jobs' own preflight, and simulate, run and demo,
which used to print a traceback and exit 1)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.broker import LocalBroker

SPEC = Path(__file__).resolve().parents[2] / "examples" / "app_language.toml"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _esa(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *argv], capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("command", ["simulate", "demo", "run", "encode", "shuffle", "analyze"])
def test_an_unreachable_broker_is_one_line_and_exit_4(command: str, tmp_path: Path) -> None:
    bootstrap = f"127.0.0.1:{_closed_port()}"
    if command == "simulate":
        argv = ["simulate", "--bootstrap", bootstrap, "--clients", "10"]
    elif command == "demo":
        argv = ["demo", "--bootstrap", bootstrap, "--clients", "100", "--out", str(tmp_path / "demo")]
    else:
        from transforms.trust.keys import init_keys

        init_keys(tmp_path / "out.keys")  # the keys are checked first: this test is about the broker
        argv = [command, "--spec", str(SPEC), "--kafka_bootstrap", bootstrap, "--output_dir", str(tmp_path / "out")]
    done = _esa(*argv)
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower() or "Traceback" in line]
    assert done.returncode == 4, done.stderr[-1500:]
    assert errors == [f"esa {command}: error: cannot reach Kafka at {bootstrap} (confluent, security.protocol "
                      "plaintext): Failed to get metadata: Local: Broker transport failure"], done.stderr[-1500:]


def test_run_refuses_a_missing_raw_topic(broker: LocalBroker, tmp_path: Path) -> None:
    from transforms.trust.keys import init_keys

    init_keys(tmp_path / "out.keys")
    done = _esa("run", "--spec", str(SPEC), "--kafka_bootstrap", broker.bootstrap, "--raw_topic", "no-such-raw",
                "--output_dir", str(tmp_path / "out"))
    assert done.returncode == 4 and done.stderr.strip().splitlines()[-1].startswith(
        "esa run: error: topic(s) 'no-such-raw' do not exist"), done.stderr[-1500:]
