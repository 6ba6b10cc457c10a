"""Run one function in N forked processes released together by a barrier, and collect their results."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any


def _worker(barrier: Any, results: Any, fn: Callable[..., Any], index: int, args: tuple[Any, ...]) -> None:
    barrier.wait()
    try:
        results.put((index, fn(index, *args)))
    except BaseException as err:  # reported, so the test fails with the child's error
        results.put((index, err))


def race(n: int, fn: Callable[..., Any], *args: Any, timeout_s: float = 60.0) -> list[Any]:
    """``[fn(i, *args) for i in range(n)]``, each in its own process, all started at the same instant."""
    ctx = multiprocessing.get_context("fork")
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
