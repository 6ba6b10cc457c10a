"""Process helpers: N spawned racers released together by a barrier; Python children to kill -9."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def _worker(barrier: Any, results: Any, fn: Callable[..., Any], index: int, args: tuple[Any, ...]) -> None:
    barrier.wait()
    try:
        results.put((index, fn(index, *args)))
    except BaseException as err:  # reported, so the test fails with the child's error
        results.put((index, err))


def race(n: int, fn: Callable[..., Any], *args: Any, timeout_s: float = 60.0) -> list[Any]:
    """``[fn(i, *args) for i in range(n)]``, each in its own process, all started at the same instant.

    Spawned, not forked: in a whole test session the parent holds Beam's and Kafka's threads, and a fork taken
    while one of them holds a lock can hang the child before it reaches the barrier (seen once in a full run).
    The barrier, not the start, sets the race: the children start at their own pace and wait for one another.
    """
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(barrier, results, fn, i, args)) for i in range(n)]
    for proc in procs:
        proc.start()
    out = dict(results.get(timeout=timeout_s) for _ in procs)
    for proc in procs:
        proc.join(timeout_s)
    for index, value in out.items():
        if isinstance(value, BaseException):
            raise AssertionError(f"racer {index} failed: {value!r}") from value
    return [out[i] for i in range(n)]


def spawn(code: str, *args: str) -> subprocess.Popen[str]:
    """A Python child running ``code`` with this checkout importable; its stdout is a pipe of lines."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], stdout=subprocess.PIPE,
                            text=True, env=env)


def kill_9_when_ready(code: str, *args: str, after_s: float) -> subprocess.Popen[str]:
    """Run ``code`` (which prints "ready" once it is busy), SIGKILL it ``after_s`` later, wait for it."""
    import signal
    import time

    child = spawn(code, *args)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        time.sleep(after_s)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    return child
