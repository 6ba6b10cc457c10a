"""The shuffler-side privacy blanket: how many dummies a colluder-proof epsilon needs, and what they cost.

For GRR and OUE over d in {2, 16, 128} at local eps0 in {1, 2, 4} and delta 1e-6: the smallest number m of
blanket dummies per release whose exact central epsilon (replacement; against any number of colluding devices,
transforms/privacy/blanket.py) is at most eps_c in {1, 0.5}; the epsilon reached; the honest-crowd tight bound
at n = 10,000 for comparison; the cost in accuracy (the standard error of one category's count with the
dummies over that without, at n = 10,000 real reports spread uniformly, i.e. sqrt(1 + m B (1 - B) / V) with
V the count variance of the real reports and B the probability that a dummy counts for the category: 1/d for
GRR, q for OUE); and the time to compute eps_blanket(m) once (median of 5) and to search for m.

    .venv/bin/python benchmarks/blanket.py            # the grid (~seconds)
    .venv/bin/python benchmarks/blanket.py --quick    # d = 16, eps0 = 2 only
    .venv/bin/python benchmarks/blanket.py --json out.json
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import datetime  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transforms.privacy.blanket import dummies_needed, epsilon_blanket  # noqa: E402
from transforms.privacy.mixture import alpha_grr, alpha_oue  # noqa: E402
from transforms.privacy.shuffle_bound import epsilon_central  # noqa: E402

RANDOMIZERS = ("grr", "oue")
DOMAINS = (2, 16, 128)
LOCAL = (1.0, 2.0, 4.0)
TARGETS = (1.0, 0.5)
DELTA = 1e-6
N_REAL = 10_000


def stderr_ratio(randomizer: str, d: int, eps0: float, m: int, n: int = N_REAL) -> float:
    """sd of a category's count estimate with m dummies over that without, n real reports with f = 1/d."""
    e = math.exp(eps0)
    if randomizer == "grr":
        p, q, cell = e / (e + d - 1), 1.0 / (e + d - 1), 1.0 / d
    else:
        p, q = 0.5, 1.0 / (1.0 + e)
        cell = q
    c = n / d
    real = c * p * (1.0 - p) + (n - c) * q * (1.0 - q)
    return math.sqrt((real + m * cell * (1.0 - cell)) / real)


def bench(randomizer: str, d: int, eps0: float, target: float) -> dict:
    t0 = time.perf_counter()
    m = dummies_needed(d, eps0, target, DELTA, randomizer=randomizer)
    search_s = time.perf_counter() - t0
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        reached = epsilon_blanket(d, eps0, m, DELTA, randomizer=randomizer)
        times.append(time.perf_counter() - t0)
    alpha = alpha_grr(eps0, d) if randomizer == "grr" else alpha_oue(eps0)
    honest = epsilon_central(N_REAL, alpha, eps0, DELTA)
    return {"randomizer": randomizer, "d": d, "eps0": eps0, "target": target, "m": m, "eps_blanket": reached,
            "eps_honest_n": honest, "stderr_ratio": stderr_ratio(randomizer, d, eps0, m),
            "eps_time_s": statistics.median(times), "search_s": search_s}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="d = 16, eps0 = 2 only")
    parser.add_argument("--randomizers", default=",".join(RANDOMIZERS), help="comma-separated: grr, oue")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    domains, local = ((16,), (2.0,)) if args.quick else (DOMAINS, LOCAL)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, load {load:.2f}, Python {platform.python_version()}, delta {DELTA:g}, "
          f"n = {N_REAL} for eps_honest and the stderr ratio")
    print(f"{'mech':>4} {'d':>4} {'eps0':>4} {'eps_c':>5} {'m':>7} {'eps(m)':>8} {'honest n':>8} {'sd x':>6} "
          f"{'eps time':>9} {'m search':>9}")
    rows = []
    for randomizer in args.randomizers.split(","):
        for d, eps0, target in itertools.product(domains, local, TARGETS):
            row = bench(randomizer, d, eps0, target)
            rows.append(row)
            print(f"{randomizer:>4} {d:>4} {eps0:>4g} {target:>5g} {row['m']:>7} {row['eps_blanket']:>8.4f} "
                  f"{row['eps_honest_n']:>8.4f} {row['stderr_ratio']:>6.3f} {1e3 * row['eps_time_s']:>7.2f}ms "
                  f"{1e3 * row['search_s']:>7.1f}ms")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
