"""Per-record public-key work on every core of a worker, inside one DoFn call.

Why threads: the jobs' hot paths are a few public-key operations per record (the shuffler's Ed25519
verification, 59 microseconds here; the analyzer's X25519, 31; the encoder's key expansion, two X25519
multiplications and a signature, ~87), and libsodium releases the GIL inside each. Beam's in-process runner
runs a stage on one thread, and a distributed runner sizes its workers by cores, not by how much of a
record's time is spent outside the GIL; a small pool per worker process turns the idle cores into
throughput without changing what the DoFn emits or in which order.

What goes on the pool: the GIL-free calls and nothing else (``verify_detached``, ``open_many``'s and
``seal_many``'s multiplications, ``sign_many``). A thread coming back from C must win the GIL back from a
thread running Python, and waits up to a switch interval for it; when the pool also ran decoding and checks,
two threads were slower than one (measured on the analyzer: 130 against 68 microseconds per message; with
only the multiplications on the pool, 31).

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
