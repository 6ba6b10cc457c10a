"""Does overlapping Python work with the crypto pool pay? (Why the jobs run the pool's calls in a separate pass.)

A shuffler-like loop: per set, ~30 microseconds of pure Python (standing in for decoding and checks) and one
libsodium Ed25519 verification. Sequential: all the Python first, then every verification on a 2-thread pool
(what ``transforms.shuffler.ingress`` does). Overlapped: the pool verifies each chunk while the loop runs the Python of
the next. Printed per interpreter switch interval: microseconds per set of each (lower is better), and the
ideal (all the CPU work spread over 2 cores).

    python benchmarks/pool_overlap.py --sets 6000
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere

from transforms.trust.ed25519 import SodiumSigner, verify_detached

THREADS = 2


def python_work(i: int, steps: int = 800) -> int:
    """About 30 microseconds of interpreter work that holds the GIL throughout."""
    x = 0
    for k in range(steps):
        x += k * i
    return x


def _verify_all(chunk: list[tuple[bytes, bytes, bytes]]) -> list[bool]:
    return [verify_detached(*job) for job in chunk]


def sequential(jobs: list[tuple[bytes, bytes, bytes]], pool: ThreadPoolExecutor) -> None:
    for i in range(len(jobs)):
        python_work(i)
    size = max(1, len(jobs) // (4 * THREADS))
    list(pool.map(_verify_all, [jobs[i:i + size] for i in range(0, len(jobs), size)]))


def overlapped(jobs: list[tuple[bytes, bytes, bytes]], pool: ThreadPoolExecutor, chunk: int = 64) -> None:
    futures = []
    for start in range(0, len(jobs), chunk):
        for i in range(start, min(len(jobs), start + chunk)):
            python_work(i)
        futures.append(pool.submit(_verify_all, jobs[start:start + chunk]))
    for future in futures:
        future.result()


def per_set_us(fn, jobs, pool) -> float:
    started = time.perf_counter()
    fn(jobs, pool)
    return (time.perf_counter() - started) / len(jobs) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", type=int, default=6000)
    args = parser.parse_args()
    signers = [SodiumSigner(os.urandom(32)) for _ in range(50)]
    messages = [os.urandom(300) for _ in range(args.sets)]
    jobs = [(signers[i % 50].public_bytes_raw(), signers[i % 50].sign(m), m) for i, m in enumerate(messages)]
    started = time.perf_counter()
    for i in range(args.sets):
        python_work(i)
    python_us = (time.perf_counter() - started) / args.sets * 1e6
    started = time.perf_counter()
    _verify_all(jobs)
    verify_us = (time.perf_counter() - started) / args.sets * 1e6
    print(f"one thread: Python {python_us:.1f} us/set, verification {verify_us:.1f} us/set; "
          f"ideal on {THREADS} cores {(python_us + verify_us) / THREADS:.1f} us/set (load {os.getloadavg()[0]:.1f})")
    with ThreadPoolExecutor(THREADS) as pool:
        for interval in (0.005, 0.0005, 0.0001):
            sys.setswitchinterval(interval)
            seq, ovl = per_set_us(sequential, jobs, pool), per_set_us(overlapped, jobs, pool)
            print(f"switch interval {interval * 1000:g} ms: sequential {seq:.1f} us/set, overlapped {ovl:.1f}")
    sys.setswitchinterval(0.005)


if __name__ == "__main__":
    main()
