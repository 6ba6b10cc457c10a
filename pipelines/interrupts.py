"""SIGINT (Ctrl-C) and SIGTERM stop an ``esa`` command in one line, with the exit code the shell expects.

Python turns SIGINT into a KeyboardInterrupt wherever the main thread is, and Beam's in-process runner
catches it inside a transform and re-raises it wrapped (``RuntimeError: KeyboardInterrupt [while running
'SealAndSign']``), so a Ctrl-C during ``esa demo`` used to end in exit 1 and three tracebacks; SIGTERM
killed the process without unwinding (no lock released, no embedded broker stopped). Here both signals
raise ``Interrupted`` in the main thread, every ``with`` block unwinds (state locks, the embedded broker,
temporary directories), and whatever the exception looks like by the time it reaches ``esa``'s main, the
signal that was received decides: one line and ``128 + signal number`` (130 for SIGINT, 143 for SIGTERM).

A ``--follow`` job and the streaming shuffler install their own handlers while they run: there the first
signal asks for a graceful stop after the current run commits (exit 0), as docs/operations.md says.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _quiet_beam(record: logging.LogRecord) -> bool:
    return not record.name.startswith("apache_beam")


class Interrupted(KeyboardInterrupt):
    """A stop signal arrived; ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopSignals:
    """The first stop signal received while installed (``received``), raised as ``Interrupted``."""

    def __init__(self) -> None:
        self.received: int | None = None

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
            for handler in logging.getLogger().handlers:  # Beam logs, with a traceback, the interrupt it
                handler.addFilter(_quiet_beam)  # re-raises from each transform it was in: noise now
        raise Interrupted(signum)

    def exit_code(self, default: int = signal.SIGINT) -> int:
        """``128 + N`` of the signal received (of ``default`` for a KeyboardInterrupt without one)."""
        return 128 + int(self.received or default)

    def name(self, default: int = signal.SIGINT) -> str:
        return signal.Signals(self.received or default).name


@contextmanager
def stop_signals() -> Iterator[StopSignals]:
    """Install the handlers for the block (main thread only: elsewhere signals cannot be caught), then restore."""
    stop = StopSignals()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {sig: signal.signal(sig, stop.handle) for sig in STOP_SIGNALS}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for handler in logging.getLogger().handlers:
            handler.removeFilter(_quiet_beam)
