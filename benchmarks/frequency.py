"""Throughput and accuracy of the GRR / OUE / OLH frequency oracles, next to pure-ldp.

Single thread (BLAS/OpenMP pools pinned to 1 before numpy loads), so every rate is per core. Our encode
runs in batches of ``--batch`` reports, as the Beam encode stage feeds it; "keyed" includes deriving the
per-element SipHash keys (what a retry-safe DoFn does). Aggregate+estimate folds all n reports into one
accumulator and decodes it. pure-ldp's clients and servers are per-report Python objects, so they are
timed on a subsample (``--pure-n``) and the per-report rate is extrapolated; the label says so.

    .venv/bin/python benchmarks/frequency.py            # n = 1e6, d = 64, eps = 2
    .venv/bin/python benchmarks/frequency.py --quick    # n = 1e5, smaller pure-ldp subsample
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere

from transforms.mechanisms.frequency import GRR, OLH, OUE, make_frequency_mechanism  # noqa: E402
from transforms.mechanisms.randomness import KeyedRandom, job_key_from_entropy  # noqa: E402

Mech = GRR | OUE | OLH


@dataclass
class Row:
    name: str
    encode: float = float("nan")
    encode_keyed: float = float("nan")
    aggregate: float = float("nan")
    pure_encode: float = float("nan")
    pure_aggregate: float = float("nan")
    err_ours: float = float("nan")
    err_pure: float = float("nan")
    iterations: int | None = None


def zipf_values(n: int, d: int, rng: np.random.Generator, s: float = 1.1) -> np.ndarray:
    w = 1.0 / np.arange(1, d + 1) ** s
    return rng.choice(d, size=n, p=w / w.sum())


def median_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def bench_ours(mech: Mech, values: np.ndarray, batch: int, repeats: int, seed: int) -> tuple[Row, np.ndarray]:
    n = values.size
    spans = [slice(a, min(a + batch, n)) for a in range(0, n, batch)]
    rng = np.random.default_rng(seed)  # a simulation: seeded on purpose
    ids = np.arange(n, dtype=np.uint64)
    key = job_key_from_entropy()

    def encode() -> np.ndarray:
        return np.concatenate([mech.encode(values[s], rng) for s in spans])

    def encode_keyed() -> np.ndarray:
        return np.concatenate([
            mech.encode(values[s], KeyedRandom.for_elements(key, ids[s])) for s in spans
        ])

    t_enc, reports = median_time(encode, repeats)
    t_keyed, _ = median_time(encode_keyed, repeats)

    def aggregate() -> Any:
        acc = mech.new_accumulator()
        acc.add(reports)
        return acc.estimate()

    t_agg, est = median_time(aggregate, repeats)
    truth = np.bincount(values, minlength=mech.d)
    row = Row(mech.name, encode=n / t_enc, encode_keyed=n / t_keyed, aggregate=n / t_agg,
              err_ours=float(np.max(np.abs(est.count - truth) / (est.stderr * n))),
              iterations=est.extras.get("solver_iterations"))
    return row, reports


def bench_pure_ldp(mech: Mech, values: np.ndarray, row: Row) -> str | None:
    """Time pure-ldp's equivalent oracle on ``values`` (a subsample); None if pure-ldp is missing."""
    try:
        from pure_ldp.frequency_oracles import DEClient, DEServer, LHClient, LHServer, UEClient, UEServer
    except ImportError as exc:
        return f"pure-ldp not importable ({exc}); install with: pip install pure-ldp 'xxhash<4'"
    d, eps, ident = mech.d, mech.epsilon, (lambda x: x)
    if isinstance(mech, GRR):
        client, server = DEClient(eps, d, index_mapper=ident), DEServer(eps, d, index_mapper=ident)
    elif isinstance(mech, OUE):
        client = UEClient(eps, d, use_oue=True, index_mapper=ident)
        server = UEServer(eps, d, use_oue=True, index_mapper=ident)
    else:
        client = LHClient(eps, d, use_olh=True, index_mapper=ident)
        server = LHServer(eps, d, use_olh=True, index_mapper=ident)
        assert client.g == mech.buckets, (client.g, mech.buckets)
    np.random.seed(0)  # pure-ldp draws from the legacy global generators
    m = values.size
    py_values = values.tolist()
    t0 = time.perf_counter()
    reports = [client.privatise(x) for x in py_values]
    t1 = time.perf_counter()
    for r in reports:
        server.aggregate(r)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = np.asarray(server.estimate_all(range(d), suppress_warnings=True), dtype=float)
    t2 = time.perf_counter()
    truth = np.bincount(values, minlength=d)
    sd = np.sqrt(mech.variance(truth, m))  # closed form at the truth of the subsample
    row.pure_encode, row.pure_aggregate = m / (t1 - t0), m / (t2 - t1)
    row.err_pure = float(np.max(np.abs(est - truth) / sd))
    return None


def _fmt(x: float) -> str:
    return "n/a" if not np.isfinite(x) else f"{x:,.0f}"


def _ratio(a: float, b: float) -> str:
    return "n/a" if not (np.isfinite(a) and np.isfinite(b)) else f"{a / b:,.0f}x"


def print_tables(rows: list[Row], n: int, pure_n: int) -> None:
    head = ["mechanism", "ours encode rep/s", "ours encode keyed rep/s", "ours aggregate+estimate rep/s",
            f"pure-ldp encode rep/s (on {pure_n:,}, extrap.)",
            f"pure-ldp aggregate+estimate rep/s (on {pure_n:,}, extrap.)", "ratio encode", "ratio aggregate"]
    body = [[r.name, _fmt(r.encode), _fmt(r.encode_keyed), _fmt(r.aggregate), _fmt(r.pure_encode),
             _fmt(r.pure_aggregate), _ratio(r.encode, r.pure_encode), _ratio(r.aggregate, r.pure_aggregate)]
            for r in rows]
    _table(head, body)
    print()
    head = ["mechanism", f"ours max|err|/stderr (n={n:,})", f"pure-ldp max|err|/stderr (n={pure_n:,})",
            "OLH solver iterations"]
    _table(head, [[r.name, f"{r.err_ours:.2f}", "n/a" if not np.isfinite(r.err_pure) else f"{r.err_pure:.2f}",
                   "-" if r.iterations is None else str(r.iterations)] for r in rows])


def _table(head: list[str], body: list[list[str]]) -> None:
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for b in body:
        print("| " + " | ".join(c.rjust(w) for c, w in zip(b, widths, strict=True)) + " |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=None, help="reports per mechanism (default 1e6, quick 1e5)")
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--epsilon", type=float, default=2.0)
    ap.add_argument("--batch", type=int, default=1 << 16, help="encode batch size (a Beam bundle)")
    ap.add_argument("--repeats", type=int, default=None, help="timing repeats, median taken (default 5)")
    ap.add_argument("--pure-n", type=int, default=None, help="pure-ldp subsample (default 20,000)")
    ap.add_argument("--quick", action="store_true", help="n = 1e5, 3 repeats, pure-ldp on 2,000 reports")
    ap.add_argument("--mechanisms", default="grr,oue,olh")
    args = ap.parse_args(argv)
    n = args.n or (100_000 if args.quick else 1_000_000)
    repeats = args.repeats or (3 if args.quick else 5)
    pure_n = min(n, args.pure_n or (2_000 if args.quick else 20_000))

    rng = np.random.default_rng(2024)
    values = zipf_values(n, args.d, rng)
    sub = values[:pure_n]
    print(f"# frequency oracles: n={n:,}, d={args.d}, eps={args.epsilon}, single thread, "
          f"median of {repeats}; numpy {np.__version__}, python {sys.version.split()[0]}")
    rows, notes = [], set()
    for name in args.mechanisms.split(","):
        mech = make_frequency_mechanism(name.strip(), args.d, args.epsilon)
        print(f"#   {mech!r}: {mech.message_bits} bits/report", flush=True)
        row, _ = bench_ours(mech, values, args.batch, repeats, seed=7)
        note = bench_pure_ldp(mech, sub, row)
        if note:
            notes.add(note)
        rows.append(row)
    print()
    print_tables(rows, n, pure_n)
    for note in sorted(notes):
        print(f"\n{note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
