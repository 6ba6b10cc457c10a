"""Per-record public-key work on every core of a worker, inside one DoFn call.

Why threads: the shuffler's hot path is one Ed25519 verification per message set (about 105 microseconds
here, against ~15 of Python around it), and pyca/cryptography releases the GIL inside it (measured: 2
threads verify 1.97x as fast as one on 2 cores). Beam's in-process runner runs a stage on one thread, and
a distributed runner sizes its workers by cores, not by how much of a record's time is spent outside the
GIL; a small pool per worker process turns the idle cores into throughput without changing what the DoFn
emits or in which order. The analyzer opens its messages on the pool too (libsodium's X25519 releases the
GIL; 41 -> 34 microseconds per message with 2 threads). The encoder does not: its per-set work alternates
short GIL-free calls (sign 32, two X25519 multiplications ~50) with ~60 microseconds of Python, and the GIL
hand-offs cost more than they buy (measured: 129 microseconds per set serial, 184-215 on 2-4 threads).

The pool size is ``crypto_threads`` of the job (``--crypto_threads``; 0 = the worker's CPU count, 1 = no
pool). Results come back in input order, so output is byte-identical to a serial run.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

MIN_CHUNK = 16  # items per task: fewer would spend more on the executor than on the crypto
_pools: dict[int, ThreadPoolExecutor] = {}
_lock = threading.Lock()


def thread_count(requested: int) -> int:
    """0 -> the CPU count of this process (its affinity mask where the OS has one); otherwise ``requested``."""
    if requested < 0:
        raise ValueError(f"crypto_threads must be >= 0 (0 = one per core), got {requested}")
    if requested:
        return requested
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _pool(threads: int) -> ThreadPoolExecutor:
    """One pool per size and process, shared by every DoFn instance (a worker may run several)."""
    with _lock:
        pool = _pools.get(threads)
        if pool is None:
            pool = _pools[threads] = ThreadPoolExecutor(threads, thread_name_prefix="esa-crypto")
        return pool


def map_ordered(fn: Callable[[T], R], items: Sequence[T], threads: int) -> list[R]:
    """``[fn(x) for x in items]``, spread over ``threads`` threads when there is enough to spread.

    ``fn`` must not raise for expected bad input (return the problem instead): an exception here aborts
    the whole call, which is the right outcome only for a bug.
    """
    threads = thread_count(threads)
    if threads == 1 or len(items) < 2 * MIN_CHUNK:
        return [fn(x) for x in items]
    size = max(MIN_CHUNK, -(-len(items) // (threads * 4)))  # ~4 tasks per thread evens out uneven chunks
    chunks = [items[i:i + size] for i in range(0, len(items), size)]
    futures = [_pool(threads).submit(lambda c=c: [fn(x) for x in c]) for c in chunks]
    out: list[R] = []
    for future in futures:
        out.extend(future.result())
    return out
