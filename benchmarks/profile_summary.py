"""Where the CPU goes: a py-spy raw profile, summed by what the sampled code was doing.

    py-spy record --subprocesses --format raw -o prof.txt -- python benchmarks/pipeline.py --clients 100000
    python benchmarks/profile_summary.py prof.txt

Each sample is charged to the innermost frame that names a category (so time inside kafka-python called
from our DoFn counts as Kafka, and our own code only gets what it does itself). Idle samples (threads
waiting in ``select``, ``Condition.wait``, ...) are left out when py-spy was run without ``--idle``.
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

# (category, substrings of a frame): the first category whose substring a frame contains, innermost frame first
CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    ("Ed25519 (libsodium)", ("crypto_sign",)),
    ("X25519 (libsodium)", ("crypto_scalarmult",)),
    ("HKDF, AEAD, release signatures (cryptography)", ("cryptography/", "nacl/")),
    ("privacy accounting (PLD)", ("transforms/privacy/", "dp_accounting/")),
    ("LDP mechanisms (numpy)", ("transforms/mechanisms/",)),
    ("Kafka client", ("kafka/", "confluent_kafka/")),
    ("Avro encode/decode", ("fastavro/", "schemas/__init__.py")),
    ("Parquet/Arrow", ("pyarrow/",)),
    ("Beam runner and coders", ("apache_beam/",)),
    ("esa glue (decode, checks, staging)", ("transforms/", "pipelines/")),
    ("imports and start-up", ("<frozen importlib",)),
]


# py-spy shows no native frames: time inside a C/Rust call is charged to the Python function that made it.
# These functions of ours are, as the innermost frame, almost only such a call.
NATIVE_CALLERS = {
    "sign_release_batch": "HKDF, AEAD, release signatures (cryptography)",
    "verify_release_batch": "HKDF, AEAD, release signatures (cryptography)",
    "SimulatedFleet._seed": "HKDF, AEAD, release signatures (cryptography)",
    "_derive": "HKDF, AEAD, release signatures (cryptography)",
}


# how py-spy names a job process of benchmarks/stage_process.py (a multiprocessing spawn child)
JOB_PROCESS = "--multiprocessing-fork"


def categorize(stack: list[str]) -> str:
    leaf = stack[-1].split(" (", 1)[0] if stack else ""
    if leaf in NATIVE_CALLERS:
        return NATIVE_CALLERS[leaf]
    for frame in reversed(stack):
        for name, needles in CATEGORIES:
            if any(n in frame for n in needles):
                return name
    return "other (interpreter, stdlib)"


def summarize(path: Path, jobs_only: bool = False) -> list[tuple[str, float]]:
    counts: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if jobs_only and JOB_PROCESS not in stack:
            continue
        if stack and n.isdigit():
            counts[categorize(stack.split(";"))] += int(n)
    total = sum(counts.values()) or 1
    return [(name, count / total) for name, count in counts.most_common()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path, help="py-spy --format raw output")
    parser.add_argument("--jobs_only", action="store_true",
                        help="only the jobs' own processes (benchmarks/stage_process.py children), not the "
                             "benchmark's set-up and raw client measurements")
    args = parser.parse_args()
    for name, share in summarize(args.profile, args.jobs_only):
        print(f"{share:7.1%}  {name}")


if __name__ == "__main__":
    main()
