"""The privacy odometer: cumulative central epsilon of W windows of one population, and what it costs.

For k-RR (d = 64), OLH (g = round(e^eps + 1)) and OUE at eps0 = 1, 2, 4 and n = 1e5, 1e6 (one report per
client per window, total delta 1e-6, no crowd count): the composed epsilon (``odometer``: per-window PLD
of the tight shuffle bound, composed by dp_accounting) after 1, 10, 30 and 365 windows, next to basic
composition (W x the single-window tight bound at delta / W) and plain local DP (W x eps0). Times: building
one window's PLD (once per (n, alpha, eps0), then cached), composing and reading W windows from scratch
(``cumulative_epsilon``, one FFT self-composition), and appending one window to a running
``PrivacyOdometer`` (median over appends while it grows to 30 windows).

    .venv/bin/python benchmarks/odometer.py             # the full grid (~2 min)
    .venv/bin/python benchmarks/odometer.py --quick     # n = 1e5 only
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transforms.privacy.mixture import alpha_grr, alpha_olh, alpha_oue, olh_buckets  # noqa: E402
from transforms.privacy.odometer import PrivacyOdometer, WindowRelease, compose_releases  # noqa: E402
from transforms.privacy.shuffle_bound import epsilon_central  # noqa: E402
from transforms.privacy.shuffle_pld import shuffle_pld  # noqa: E402

WINDOWS = (1, 10, 30, 365)
DELTA = 1e-6


def _alpha(mechanism: str, eps: float) -> float:
    if mechanism == "grr":
        return alpha_grr(eps, 64)
    if mechanism == "olh":
        return alpha_olh(eps, olh_buckets(eps))
    return alpha_oue(eps)


def bench(mechanism: str, eps: float, n: int) -> dict:
    alpha = _alpha(mechanism, eps)
    release = WindowRelease(alpha, eps, n)
    t0 = time.perf_counter()
    try:
        shuffle_pld(n, alpha, eps)
        exact = True
    except ValueError:  # PLDTooLargeError: the odometer falls back to the labelled (eps, delta) pair
        exact = False
    build = time.perf_counter() - t0
    row = {"mechanism": mechanism, "eps0": eps, "n": n, "alpha": alpha, "exact_pld": exact, "build_s": build,
           "pld": {}, "basic": {}, "compose_s": {}}
    for w in WINDOWS:
        t0 = time.perf_counter()
        eps_w, method = compose_releases([release] * w, DELTA)
        row["compose_s"][w] = time.perf_counter() - t0
        row["pld"][w] = eps_w
        row["basic"][w] = w * epsilon_central(n, alpha, eps, DELTA / w)
    row["method"] = method
    odometer, appends = PrivacyOdometer(DELTA), []
    for _ in range(30):
        t0 = time.perf_counter()
        odometer.add(release)
        appends.append(time.perf_counter() - t0)
    row["append_s"] = statistics.median(appends)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 1e5 only")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    sizes = (10**5,) if args.quick else (10**5, 10**6)
    rows = [bench(m, e, n) for n in sizes for m in ("grr", "olh", "oue") for e in (1.0, 2.0, 4.0)]
    head = ("| mechanism | eps0 | n | " + " | ".join(f"W={w} PLD / basic" for w in WINDOWS)
            + " | local W=365 | build s | compose 365 s | append s |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        cells = " | ".join(f"{r['pld'][w]:.4g} / {r['basic'][w]:.4g}" for w in WINDOWS)
        mark = "" if r["exact_pld"] else " (fallback)"
        print(f"| {r['mechanism']}{mark} | {r['eps0']:g} | {r['n']:.0e} | {cells} | {365 * r['eps0']:g} | "
              f"{r['build_s']:.2f} | {r['compose_s'][365]:.3f} | {r['append_s']:.4f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
