"""Range-query error of the dyadic range mechanism (docs/mathematics.md §5) against ldp-hierarchical-mechanism.

Data: n clients on a 2^bits-leaf domain (default 2^16), a fixed mixture of two clipped normals and a uniform
background. Each run answers ``--ranges`` random ranges [lo, hi) (endpoints uniform, so most ranges are wide)
and reports, normalised by n: mean absolute error, root mean squared error and MSE; for our mechanism also the
fraction of answers within 3 of their own standard errors (a calibration check, ~0.997 if the stderr is
right). Medians over ``--reps`` repetitions. Every method spends the same local epsilon per client:

* ``ours-sample``: ``DyadicRange(bits, eps, oracle="llh", levels="sample")``: one level per client, full eps;
* ``ours-all``:    ``levels="all"``: every level at eps / L;
* ``lhm-1level``:  ``hierarchical_mechanism_LDP.Private_TreeBary(2^bits, 2, eps, on_all_levels=False)``:
  one random level per client at full eps (pure-ldp's OUE below 10^4 nodes per level, Hadamard response
  above), Hay et al. consistency, answers read from its post-processed CDF with our [lo, hi) convention.

The library's default mode (``on_all_levels=True``) is not compared: its post-processed answers are off by a
factor of about n (the levels hold absolute counts while the root is pinned to 1 and answers are multiplied
by N again), see :func:`default_mode_check`, which every run prints. Its ``get_range_query(a, b)`` is also
(a, b]-inclusive, not [a, b), and fails for b = 2^bits; we therefore read ``tree.cdf`` directly.

    .venv/bin/python benchmarks/ranges.py --quick                  # ~1 minute
    .venv/bin/python benchmarks/ranges.py --out out/ranges.png     # full grid, ~5 minutes, with a plot

The baseline is optional (``pip install --no-deps ldp-hierarchical-mechanism==0.1.3 tqdm``: its metadata pins
old scikit-learn/statsmodels it does not import); without it only our rows are printed.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere

from transforms.mechanisms.randomness import seeded_rng  # noqa: E402
from transforms.mechanisms.ranges.dyadic import DyadicRange  # noqa: E402

OURS = ("ours-sample", "ours-all")
BASELINE = "lhm-1level"


def baseline_available() -> bool:
    try:
        import hierarchical_mechanism_LDP  # noqa: F401
    except ImportError:
        return False
    return True


def make_data(n: int, bits: int, rng: np.random.Generator) -> np.ndarray:
    """Leaves of n clients: 45% N(0.3, 0.05), 35% N(0.7, 0.12), 20% uniform, on [0, 1) scaled to 2^bits."""
    size = 1 << bits
    u = rng.random(n)
    x = np.where(u < 0.45, rng.normal(0.3, 0.05, n), np.where(u < 0.8, rng.normal(0.7, 0.12, n), rng.random(n)))
    return np.clip(np.floor(x * size), 0, size - 1).astype(np.int64)


def random_ranges(count: int, bits: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``count`` ranges [lo, hi) with endpoints drawn uniformly from 0..2^bits (lo < hi)."""
    a = rng.integers(0, (1 << bits) + 1, count)
    b = rng.integers(0, (1 << bits) + 1, count)
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    hi = np.where(hi == lo, lo + 1, hi)
    return np.minimum(lo, (1 << bits) - 1), hi


def true_answers(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    s = np.sort(x)
    return (np.searchsorted(s, hi, "left") - np.searchsorted(s, lo, "left")).astype(np.float64)


def run_ours(x: np.ndarray, bits: int, eps: float, levels: str, lo: np.ndarray, hi: np.ndarray,
             rng: np.random.Generator, oracle: str = "llh") -> tuple[np.ndarray, np.ndarray, float]:
    """(answers, stderrs, seconds for encode + accumulate + estimate + answers)."""
    t0 = time.perf_counter()
    mech = DyadicRange(bits, eps, oracle=oracle, levels=levels)
    acc = mech.new_accumulator()
    step = 1 << 16
    for start in range(0, x.size, step):
        part = x[start : start + step]
        acc.add(mech.encode_messages(part, rng)[0], part.size)
    est, se = acc.estimate().answers(lo, hi)
    return est, se, time.perf_counter() - t0


def _lhm_tree(x: np.ndarray, bits: int, eps: float, all_levels: bool, seed: int) -> Any:
    from hierarchical_mechanism_LDP import Private_TreeBary

    random.seed(seed)  # pure-ldp draws from the global generators: seeded so that runs repeat
    np.random.seed(seed % 2**32)
    tree = Private_TreeBary(1 << bits, 2, eps, on_all_levels=all_levels)
    tree.update_tree(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tree.compute_attributes()
    tree.post_process()
    return tree


def lhm_cdf_answers(cdf: np.ndarray, n: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """[lo, hi) counts from the library's post-processed CDF (cdf[i] = mass of leaves 0..i, as a fraction)."""
    cum = np.concatenate([[0.0], np.asarray(cdf, dtype=np.float64)])
    return (cum[hi] - cum[lo]) * n


def run_baseline(x: np.ndarray, bits: int, eps: float, lo: np.ndarray, hi: np.ndarray,
                 seed: int) -> tuple[np.ndarray, float]:
    t0 = time.perf_counter()
    tree = _lhm_tree(x, bits, eps, all_levels=False, seed=seed)
    est = lhm_cdf_answers(tree.cdf, x.size, lo, hi)
    return est, time.perf_counter() - t0


def default_mode_check(n: int = 2000, bits: int = 16, eps: float = 4.0, seed: int = 7) -> dict[str, float]:
    """The library's default mode (every level, eps / L each so the client is eps-LDP in total): median ratio of
    its ``get_range_query`` answer to the truth over a few ranges, and the total of its CDF (should be 1)."""
    rng = seeded_rng(seed)
    x = make_data(n, bits, rng)
    levels = bits  # branching 2: one level per bit below the root
    tree = _lhm_tree(x, bits, eps / levels, all_levels=True, seed=seed)
    lo, hi = random_ranges(50, bits, rng)
    hi = np.minimum(hi, (1 << bits) - 1)  # its get_range_query indexes cdf[hi] and fails at hi = 2^bits
    lib = np.array([tree.get_range_query(int(a), int(b)) for a, b in zip(lo, hi, strict=True)])
    truth = true_answers(x, lo + 1, hi + 1)  # it answers (a, b]
    ok = truth > 0
    return {"n": n, "median_ratio": float(np.median(lib[ok] / truth[ok])), "cdf_total": float(tree.cdf[-1])}


def metrics(est: np.ndarray, truth: np.ndarray, n: int, se: np.ndarray | None) -> dict[str, float]:
    err = (est - truth) / n
    out = {"mae": float(np.mean(np.abs(err))), "rmse": float(np.sqrt(np.mean(err**2))), "mse": float(np.mean(err**2))}
    out["in3se"] = float(np.mean(np.abs(est - truth) <= 3 * se)) if se is not None else float("nan")
    return out


def run_grid(ns: list[int], epsilons: list[float], bits: int, reps: int, ranges: int, seed: int,
             with_baseline: bool) -> list[dict[str, Any]]:
    rows = []
    methods = (*OURS, BASELINE) if with_baseline else OURS
    for eps in epsilons:
        for n in ns:
            per: dict[str, list[dict[str, float]]] = {m: [] for m in methods}
            for rep in range(reps):
                rng = seeded_rng(seed + 1000 * rep + n + int(10 * eps))  # a simulation: seeded on purpose
                x = make_data(n, bits, rng)
                lo, hi = random_ranges(ranges, bits, rng)
                truth = true_answers(x, lo, hi)
                for levels, name in (("sample", "ours-sample"), ("all", "ours-all")):
                    est, se, sec = run_ours(x, bits, eps, levels, lo, hi, rng)
                    per[name].append({**metrics(est, truth, n, se), "seconds": sec})
                if with_baseline:
                    est, sec = run_baseline(x, bits, eps, lo, hi, seed + rep)
                    per[BASELINE].append({**metrics(est, truth, n, None), "seconds": sec})
            for name, runs in per.items():
                med = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
                rows.append({"eps": eps, "n": n, "method": name, **med})
                print(f"{eps:>4g} {n:>7} {name:<12} {med['mae']:>9.5f} {med['rmse']:>9.5f} {med['mse']:>9.2e} "
                      f"{med['in3se']:>6.3f} {med['seconds']:>8.2f}", flush=True)
    return rows


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epsilons = sorted({r["eps"] for r in rows})
    fig, axes = plt.subplots(1, len(epsilons), figsize=(4.2 * len(epsilons), 3.6), squeeze=False)
    for ax, eps in zip(axes[0], epsilons, strict=True):
        for method in dict.fromkeys(r["method"] for r in rows):
            sel = sorted((r["n"], r["mae"]) for r in rows if r["eps"] == eps and r["method"] == method)
            ax.loglog([s[0] for s in sel], [s[1] for s in sel], "o-", label=method)
        ax.set_title(f"eps = {eps:g}")
        ax.set_xlabel("clients n")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("mean |error| / n of range answers")
    axes[0][0].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"plot written to {path}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="n in {1e4, 3e4, 1e5}, one repetition (~1 minute)")
    parser.add_argument("--bits", type=int, default=16)
    parser.add_argument("--n", type=int, nargs="+", default=[10_000, 30_000, 100_000, 300_000])
    parser.add_argument("--eps", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--ranges", type=int, default=200, help="random ranges answered per run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-baseline", action="store_true", help="skip ldp-hierarchical-mechanism")
    parser.add_argument("--out", type=Path, help="write a PNG of mean |error|/n against n")
    args = parser.parse_args(argv)
    ns, reps = ([10_000, 30_000, 100_000], 1) if args.quick else (args.n, args.reps)
    with_baseline = not args.no_baseline and baseline_available()
    if not args.no_baseline and not with_baseline:
        print("ldp-hierarchical-mechanism not installed: baseline skipped "
              "(pip install --no-deps ldp-hierarchical-mechanism==0.1.3 tqdm)")
    if with_baseline:
        check = default_mode_check(bits=args.bits, seed=args.seed)
        print(f"lhm default mode (every level, eps/L each), n={check['n']}: get_range_query / truth = "
              f"{check['median_ratio']:.0f} (median over 50 ranges), CDF total {check['cdf_total']:.1f} "
              f"(should be 1): not compared\n")
    print(f"range queries over 2^{args.bits} leaves, {args.ranges} random ranges per run, medians of {reps} "
          f"repetition(s); errors are divided by n")
    header = f"{'eps':>4} {'n':>7} {'method':<12} {'MAE/n':>9} {'RMSE/n':>9} {'MSE/n^2':>9} {'in3se':>6} {'seconds':>8}"
    print(header)
    print("-" * len(header))
    rows = run_grid(ns, args.eps, args.bits, reps, args.ranges, args.seed, with_baseline)
    if with_baseline:
        print("\nMAE ratio lhm-1level / ours-sample, and ours-all / ours-sample:")
        for eps in args.eps:
            for n in ns:
                get = {r["method"]: r["mae"] for r in rows if r["eps"] == eps and r["n"] == n}
                print(f"  eps={eps:g} n={n}: {get[BASELINE] / get['ours-sample']:.2f}, "
                      f"{get['ours-all'] / get['ours-sample']:.2f}")
    print("\nin3se: fraction of answers within 3 of their own standard errors (ours only); seconds: whole run "
          "(encode, aggregate, estimate, answer); the baseline randomizes one client at a time in Python.")
    if args.out:
        plot(rows, args.out)


if __name__ == "__main__":
    main()
