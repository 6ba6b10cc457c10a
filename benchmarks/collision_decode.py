"""Decode time of Collision / CoCo at telemetry scale: n reports, d keys, s keys per client (issue 4 contract:
"decoding 1e6 reports with d = 10,000 keys finishes in seconds").

Single thread (BLAS/OpenMP pools pinned to 1 before numpy loads). Reports are encoded once (timed too, for
reference), then: *accumulate* = validate + fold all n reports into one accumulator (``counts[seed, z]``,
S x t); *estimate* = the count-trick decode (hash the 2d items (Collision) or d keys (CoCo) under every seed of
the family, gather, invert, standard errors). Median of ``--repeats`` runs each. Clients hold up to s distinct
keys drawn from a Zipf(1.1) popularity over the d keys (short rows when the draw repeats), signs biased per key.

    .venv/bin/python benchmarks/collision_decode.py            # n = 1e6, d = 1e4, s = 16, eps = 1
    .venv/bin/python benchmarks/collision_decode.py --quick    # n = 1e5, d = 2,000
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere

from benchmarks.frequency import median_time  # noqa: E402
from transforms.mechanisms.keyvalue.collision import CoCo, Collision  # noqa: E402


def telemetry_items(n: int, d: int, s: int, rng: np.random.Generator) -> np.ndarray:
    """``[n, s]`` items: up to s distinct Zipf-popular keys per client (first distinct of 2s draws), -1 padded."""
    w = 1.0 / np.arange(1, d + 1) ** 1.1
    draws = rng.choice(d, size=(n, 2 * s), p=w / w.sum())
    order = np.argsort(draws, axis=1, kind="stable")
    ordered = np.take_along_axis(draws, order, axis=1)
    first = np.ones_like(draws, dtype=bool)
    first[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    keep = np.zeros_like(first)
    np.put_along_axis(keep, order, first, axis=1)  # first occurrence of each key, in draw order
    rank = np.cumsum(keep, axis=1) - 1
    keys = np.full((n, s), -1)
    rows, cols = np.nonzero(keep & (rank < s))
    keys[rows, rank[rows, cols]] = draws[rows, cols]
    plus = rng.random((n, s)) < 0.2 + 0.6 * (np.maximum(keys, 0) % 7) / 6  # sign bias varies by key
    return np.where(keys >= 0, 2 * keys + plus, -1)


def bench(mech: Collision | CoCo, items: np.ndarray, repeats: int, batch: int) -> dict[str, Any]:
    rng = np.random.default_rng(11)  # a simulation: seeded on purpose
    n = items.shape[0]
    t0 = time.perf_counter()
    reports = np.concatenate([mech.encode(items[a:a + batch], rng) for a in range(0, n, batch)])
    t_encode = time.perf_counter() - t0

    def accumulate() -> Any:
        acc = mech.new_accumulator()
        acc.add(reports)
        return acc

    t_acc, acc = median_time(accumulate, repeats)
    t_est, est = median_time(acc.estimate, repeats)
    truth = np.zeros(2 * mech.d)
    np.add.at(truth, items[items >= 0], 1.0)
    truth /= n
    z = (est.frequency - truth) / est.frequency_stderr
    mean_true = truth[1::2] - truth[0::2]
    z_mean = (est.mean - mean_true) / est.mean_stderr
    return {"name": mech.name, "t": mech.cells, "S": mech.seed_family, "encode": t_encode, "accumulate": t_acc,
            "estimate": t_est, "z_max": float(np.max(np.abs(z))), "z_rms": float(np.sqrt(np.mean(z**2))),
            "z_mean_rms": float(np.sqrt(np.mean(z_mean**2))), "family_share": est.extras["family_share"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=None, help="reports (default 1e6, quick 1e5)")
    ap.add_argument("--d", type=int, default=None, help="keys (default 10,000, quick 2,000)")
    ap.add_argument("--s", type=int, default=16)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--seed-family", type=int, default=None, help="default: the mechanisms' default (4096)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1 << 16, help="encode batch size (a Beam bundle)")
    ap.add_argument("--mechanisms", default="collision,coco")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    n = args.n or (100_000 if args.quick else 1_000_000)
    d = args.d or (2_000 if args.quick else 10_000)
    extra = {} if args.seed_family is None else {"seed_family": args.seed_family}
    items = telemetry_items(n, d, args.s, np.random.default_rng(2024))
    print(f"# n={n:,} reports, d={d:,} keys, s={args.s}, eps={args.epsilon}, mean keys/client "
          f"{(items >= 0).sum(axis=1).mean():.2f}; single thread, median of {args.repeats}; numpy {np.__version__}")
    head = ["mechanism", "t", "seeds S", "encode s", "accumulate s", "estimate s", "max|z| items", "rms z items",
            "rms z means", "family share"]
    rows = []
    for name in args.mechanisms.split(","):
        cls = {"collision": Collision, "coco": CoCo}[name.strip()]
        r = bench(cls(d, args.s, args.epsilon, **extra), items, args.repeats, args.batch)
        rows.append([r["name"], str(r["t"]), str(r["S"]), f"{r['encode']:.2f}", f"{r['accumulate']:.3f}",
                     f"{r['estimate']:.2f}", f"{r['z_max']:.2f}", f"{r['z_rms']:.2f}", f"{r['z_mean_rms']:.2f}",
                     f"{r['family_share']:.3f}"])
    widths = [max(len(h), *(len(b[i]) for b in rows)) for i, h in enumerate(head)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for b in rows:
        print("| " + " | ".join(c.rjust(w) for c, w in zip(b, widths, strict=True)) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
