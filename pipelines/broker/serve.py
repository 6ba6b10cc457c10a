"""`esa broker`: one Apache Kafka on loopback for a demo or a walk-through, until SIGINT / SIGTERM."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

from pipelines.broker.errors import BrokerError
from pipelines.broker.jars import KAFKA_VERSION
from pipelines.broker.local import LocalBroker
from pipelines.exit_codes import ExitCode


def run_broker_forever(port: int | None = None, data_dir: Path | None = None) -> int:
    """Start a broker, print its bootstrap address (the only line on stdout, for scripts), serve until a
    signal, stop it in order; returns the exit code (4 when the broker cannot start or dies)."""
    stop_requested = threading.Event()

    def _on_signal(signum: int, _frame: object) -> None:
        stop_requested.set()

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with LocalBroker(port, data_dir=data_dir) as broker:
            print(broker.bootstrap, flush=True)
            where = f"kept in {data_dir}" if data_dir is not None else "in a temporary directory, removed on stop"
            print(f"Apache Kafka {KAFKA_VERSION} on {broker.bootstrap} (pid {broker.pid}, log {broker.log_path}, "
                  f"data {where}); Ctrl-C or SIGTERM to stop", file=sys.stderr, flush=True)
            while not stop_requested.wait(0.5):
                if not broker.running:
                    print(f"esa broker: Apache Kafka exited unexpectedly\n{broker.log_tail()}", file=sys.stderr)
                    return int(ExitCode.KAFKA_UNREACHABLE)
            print("esa broker: stopping", file=sys.stderr, flush=True)
        return 0
    except BrokerError as exc:
        print(f"esa broker: {exc}", file=sys.stderr)
        if exc.detail:
            print(exc.detail, file=sys.stderr)
        return int(ExitCode.KAFKA_UNREACHABLE)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
