"""Accuracy comparison of the sparse-vector / key-value mechanisms in [CoCo]'s setting (docs/mathematics.md
§3; [CoCo] §8).

Mechanisms: Collision, CoCo ([CoCo]), PrivKV, PCKV-UE, PCKV-GRR (reconstructed baselines, §3.3-3.4); optional
``pckv-agrr`` (PCKV-GRR at ``eps' = ln(s(e^eps - 1) + 1)``, [CoCo] §3.1). Each user holds exactly s non-zero
coordinates of d with signs +-1 (``--data uniform``: support uniform, fair signs, [CoCo]'s data; ``skewed``:
Zipf(1.1) key popularity and key-dependent sign bias). For every (n, d, s, eps) and repetition the harness
encodes all users (in chunks: PCKV-UE draws ``n x d`` uniforms), decodes, and scores item frequencies
``f(j_b)`` [2d] and means ``f(j+) - f(j-)`` [d] by TVE (sum of absolute errors) and MAE (max absolute error),
raw and after the §2.9 projection ``f~ = s * Proj_simplex(f^/s)`` (means re-derived from f~). The same projection
is applied to every mechanism (``project_simplex``), so the comparison is uniform. Reported: the mean over
repetitions of ln(metric), as in 003. Data are shared by all mechanisms and budgets of one repetition (common
random numbers); Collision/CoCo draw a fresh hash family (``hash_seed``) per repetition, so the averages are over
hash families, like [CoCo]'s fully random hashing. Collision/CoCo use [CoCo]'s t rules by default (``--t-rule paper``).

    .venv/bin/python benchmarks/kv_compare.py --quick --out out/kv_quick
    .venv/bin/python benchmarks/kv_compare.py --reps 1 --jobs 2 --out out/kv_full     # [CoCo]'s full grid
    .venv/bin/python benchmarks/kv_compare.py --n 100000 --d 256 --s 16 --eps 0.5,1,2 --mechanisms collision,coco
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere

from transforms.mechanisms.keyvalue.coco import CoCo
from transforms.mechanisms.keyvalue.collision import Collision
from transforms.mechanisms.keyvalue.kv_baselines import PCKVGRR, PCKVUE, PrivKV
from transforms.mechanisms.postprocess import project_simplex

EPS_003 = (0.001, 0.01, 0.1, 0.2, 0.4, 0.8, 1.0, 1.5, 2.0)
GRID_003 = {"n": (10_000, 100_000), "d": (256, 512), "s": (4, 8, 16, 32), "eps": EPS_003}
GRID_QUICK = {"n": (10_000,), "d": (256,), "s": (4, 8, 16, 32), "eps": EPS_003}
DEFAULT_MECHANISMS = ("collision", "coco", "privkv", "pckv-ue", "pckv-grr")
METRICS = ("freq_tve", "freq_mae", "mean_tve", "mean_mae")
VARIANTS = ("raw", "proj")
COLUMNS = tuple(f"{m}_{v}" for v in VARIANTS for m in METRICS)  # e.g. freq_tve_proj
ENCODE_CHUNK = 8192  # rows per encode call: PCKV-UE's n x d temporaries stay ~ 100 MB at d = 512


def agrr_epsilon(s: int, epsilon: float) -> float:
    """[CoCo] §3.1: PCKV-GRR run at ``ln(s (e^eps - 1) + 1)``; sampling one of s pairs brings it back to eps."""
    return math.log(s * math.expm1(epsilon) + 1.0)


def make_mechanism(name: str, d: int, s: int, epsilon: float, t_rule: str = "paper", hash_seed: int = 0) -> Any:
    """The mechanism ``name`` at nominal budget ``epsilon`` (every one is epsilon-LDP end to end)."""
    if name == "collision":
        return Collision(d, s, epsilon, t_rule=t_rule, hash_seed=hash_seed)
    if name == "coco":
        return CoCo(d, s, epsilon, t_rule=t_rule, hash_seed=hash_seed)
    if name == "privkv":
        return PrivKV(d, s, epsilon)
    if name == "pckv-ue":
        return PCKVUE(d, s, epsilon)
    if name == "pckv-grr":
        return PCKVGRR(d, s, epsilon)
    if name == "pckv-agrr":
        return PCKVGRR(d, s, agrr_epsilon(s, epsilon))
    raise ValueError(f"unknown mechanism {name!r}; choose from {', '.join((*DEFAULT_MECHANISMS, 'pckv-agrr'))}")


def uniform_supports(n: int, d: int, s: int, rng: np.random.Generator) -> np.ndarray:
    """``[n, s]`` keys, each row a uniform s-subset of [d] (Floyd's algorithm, vectorised over rows)."""
    keys = np.empty((n, s), dtype=np.int64)
    for i, j in enumerate(range(d - s, d)):
        pick = rng.integers(0, j + 1, n)
        taken = (keys[:, :i] == pick[:, None]).any(axis=1)
        keys[:, i] = np.where(taken, j, pick)
    return keys


def skewed_supports(n: int, d: int, s: int, rng: np.random.Generator, zipf: float = 1.1) -> np.ndarray:
    """``[n, s]`` distinct keys drawn without replacement with Zipf(zipf) weights (Gumbel top-s, chunked)."""
    logw = -zipf * np.log(np.arange(1, d + 1))
    keys = np.empty((n, s), dtype=np.int64)
    for lo in range(0, n, ENCODE_CHUNK):
        hi = min(n, lo + ENCODE_CHUNK)
        score = logw - np.log(-np.log(rng.random((hi - lo, d))))
        keys[lo:hi] = np.argpartition(-score, s - 1, axis=1)[:, :s]
    return keys


def synthetic_items(n: int, d: int, s: int, rng: np.random.Generator, data: str = "uniform") -> np.ndarray:
    """Items ``2j + (sign = +1)`` ``[n, s]``: every user has exactly s non-zeros (§3 synthetic data)."""
    if data == "uniform":
        keys, plus_prob = uniform_supports(n, d, s, rng), np.full(d, 0.5)
    elif data == "skewed":
        keys, plus_prob = skewed_supports(n, d, s, rng), rng.permutation(np.linspace(0.1, 0.9, d))
    else:
        raise ValueError(f"data must be 'uniform' or 'skewed', got {data!r}")
    return 2 * keys + (rng.random((n, s)) < plus_prob[keys])


def score(freq_hat: np.ndarray, freq_true: np.ndarray) -> dict[str, float]:
    """TVE / MAE of item frequencies [2d] and of means [d] (``f(j+) - f(j-)``, odd minus even items)."""
    err_f = np.abs(freq_hat - freq_true)
    err_m = np.abs((freq_hat[1::2] - freq_hat[0::2]) - (freq_true[1::2] - freq_true[0::2]))
    return {"freq_tve": float(err_f.sum()), "freq_mae": float(err_f.max()),
            "mean_tve": float(err_m.sum()), "mean_mae": float(err_m.max())}


def run_mechanism(mech: Any, items: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, float, float]:
    """Encode every user (chunked), fold into one accumulator, decode: (raw frequencies, encode s, decode s)."""
    t0 = time.perf_counter()
    acc = mech.new_accumulator()
    for lo in range(0, items.shape[0], ENCODE_CHUNK):
        acc.add(mech.encode(items[lo : lo + ENCODE_CHUNK], rng))
    t1 = time.perf_counter()
    freq = np.asarray(acc.estimate().frequency, dtype=np.float64)
    return freq, t1 - t0, time.perf_counter() - t1


def run_cell(n: int, d: int, s: int, epsilons: Sequence[float], mechanisms: Sequence[str], rep: int,
             data: str = "uniform", t_rule: str = "paper", seed: int = 0) -> list[dict[str, Any]]:
    """One repetition of one (n, d, s): a fresh dataset, then every (eps, mechanism) on it. One record each."""
    base = np.random.SeedSequence([seed, n, d, s, rep, ("uniform", "skewed").index(data)])
    data_seed, *mech_seeds = base.spawn(1 + len(epsilons) * len(mechanisms))
    items = synthetic_items(n, d, s, np.random.default_rng(data_seed), data)  # a simulation: seeded on purpose
    truth = np.bincount(items.ravel(), minlength=2 * d) / n
    out = []
    for k, (eps, name) in enumerate((e, m) for e in epsilons for m in mechanisms):
        mech_rng = np.random.default_rng(mech_seeds[k])
        hash_seed = int(mech_rng.integers(0, 2**32))
        mech = make_mechanism(name, d, s, eps, t_rule, hash_seed)
        raw, t_enc, t_dec = run_mechanism(mech, items, mech_rng)
        proj = project_simplex(raw, float(s))
        rec: dict[str, Any] = {"data": data, "n": n, "d": d, "s": s, "eps": eps, "mechanism": name, "rep": rep,
                               "t": getattr(mech, "t", ""), "encode_s": t_enc, "decode_s": t_dec}
        for variant, f in (("raw", raw), ("proj", proj)):
            rec.update({f"{key}_{variant}": val for key, val in score(f, truth).items()})
        out.append(rec)
    return out


def _run_cell_star(args: tuple[Any, ...]) -> list[dict[str, Any]]:
    return run_cell(*args)


def run_grid(ns: Iterable[int], ds: Iterable[int], ss: Iterable[int], epsilons: Sequence[float],
             mechanisms: Sequence[str] = DEFAULT_MECHANISMS, reps: int = 3, data: Sequence[str] = ("uniform",),
             t_rule: str = "paper", seed: int = 0, jobs: int = 1,
             progress: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """Per-repetition records for the whole grid; ``jobs`` > 1 runs (n, d, s, rep) cells in worker processes."""
    for name in mechanisms:
        make_mechanism(name, 16, 2, 1.0)  # fail fast on a typo
    tasks = [(n, d, s, tuple(epsilons), tuple(mechanisms), rep, kind, t_rule, seed)
             for kind in data for n in ns for d in ds for s in ss for rep in range(reps)]
    tasks.sort(key=lambda task: -task[0] * task[1])  # biggest first: better packing over workers
    records: list[dict[str, Any]] = []
    if jobs <= 1:
        results: Iterable[list[dict[str, Any]]] = map(_run_cell_star, tasks)
        for cell in results:
            records += cell
            if progress:
                progress(cell)
        return records
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for cell in pool.map(_run_cell_star, tasks):
            records += cell
            if progress:
                progress(cell)
    return records


def summarise(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean of ln(metric) over repetitions per (data, n, d, s, eps, mechanism), plus mean timings."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for rec in records:
        groups[(rec["data"], rec["n"], rec["d"], rec["s"], rec["eps"], rec["mechanism"])].append(rec)
    rows = []
    for key, recs in sorted(groups.items(), key=lambda kv: (*kv[0][:5], _mech_order(kv[0][5]))):
        row: dict[str, Any] = dict(zip(("data", "n", "d", "s", "eps", "mechanism"), key, strict=True))
        row.update(reps=len(recs), t=recs[0]["t"])
        for col in COLUMNS:
            row[f"ln_{col}"] = statistics.fmean(math.log(max(r[col], 1e-300)) for r in recs)
        row["encode_s"] = statistics.fmean(r["encode_s"] for r in recs)
        row["decode_s"] = statistics.fmean(r["decode_s"] for r in recs)
        rows.append(row)
    return rows


def _mech_order(name: str) -> int:
    order = (*DEFAULT_MECHANISMS, "pckv-agrr")
    return order.index(name) if name in order else len(order)


HEADLINES = (  # (label, better mechanism, reference mechanism, ln column)
    ("Collision vs PCKV-UE, freq TVE (proj)", "collision", "pckv-ue", "ln_freq_tve_proj"),
    ("Collision vs PCKV-UE, freq MAE (proj)", "collision", "pckv-ue", "ln_freq_mae_proj"),
    ("Collision vs PCKV-UE, freq TVE (raw)", "collision", "pckv-ue", "ln_freq_tve_raw"),
    ("Collision vs PrivKV,  freq TVE (proj)", "collision", "privkv", "ln_freq_tve_proj"),
    ("Collision vs PrivKV,  freq MAE (proj)", "collision", "privkv", "ln_freq_mae_proj"),
    ("Collision vs PrivKV,  freq TVE (raw)", "collision", "privkv", "ln_freq_tve_raw"),
    ("Collision vs PCKV-GRR, freq TVE (proj)", "collision", "pckv-grr", "ln_freq_tve_proj"),
    ("CoCo vs Collision,    mean MAE (raw)", "coco", "collision", "ln_mean_mae_raw"),
    ("CoCo vs Collision,    mean MAE (proj)", "coco", "collision", "ln_mean_mae_proj"),
    ("CoCo vs Collision,    mean TVE (raw)", "coco", "collision", "ln_mean_tve_raw"),
    ("CoCo vs Collision,    mean TVE (proj)", "coco", "collision", "ln_mean_tve_proj"),
)


def headline(rows: Sequence[dict[str, Any]], min_eps: float = 0.0) -> list[dict[str, Any]]:
    """Error reduction ``1 - exp(ln A - ln B)`` (ratio of geometric means) of A over B per grid setting with
    ``eps >= min_eps``: median, range and share of settings above 60 % / 15 %."""
    table = {(r["data"], r["n"], r["d"], r["s"], r["eps"], r["mechanism"]): r for r in rows}
    settings = sorted({k[:5] for k in table if k[4] >= min_eps})
    out = []
    for label, better, ref, col in HEADLINES:
        red = [1.0 - math.exp(table[(*k, better)][col] - table[(*k, ref)][col])
               for k in settings if (*k, better) in table and (*k, ref) in table]
        if red:
            out.append({"label": label, "settings": len(red), "median": statistics.median(red), "min": min(red),
                        "max": max(red), "over60": sum(x > 0.6 for x in red) / len(red),
                        "over15": sum(x > 0.15 for x in red) / len(red)})
    return out


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """One line per (setting, mechanism): the eight mean ln(metric) columns and the mean run time."""
    head = (f"{'data':7} {'n':>6} {'d':>4} {'s':>3} {'eps':>6} {'mechanism':9} {'t':>4} "
            + " ".join(f"{c.replace('_', ' ')[:13]:>13}" for c in COLUMNS) + f" {'run s':>6}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['data']:7} {r['n']:>6} {r['d']:>4} {r['s']:>3} {r['eps']:>6g} {r['mechanism']:9} "
                     f"{r['t']!s:>4} " + " ".join(f"{r['ln_' + c]:>13.3f}" for c in COLUMNS)
                     + f" {r['encode_s'] + r['decode_s']:>6.2f}")
    return "\n".join(lines)


def format_headline(rows: Sequence[dict[str, Any]]) -> str:
    lines = []
    for min_eps in (0.0, 0.1):
        lines.append(f"Error reduction of A over B (1 - GM_A/GM_B) per setting, eps >= {min_eps:g}:")
        for h in headline(rows, min_eps):
            lines.append(f"  {h['label']:40} median {h['median']:+7.1%}  range [{h['min']:+7.1%}, {h['max']:+7.1%}]"
                         f"  >60%: {h['over60']:5.0%}  >15%: {h['over15']:5.0%}  ({h['settings']} settings)")
    return "\n".join(lines)


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def plot(rows: Sequence[dict[str, Any]], out: Path) -> list[Path]:
    """One PNG per (data, n, d, s): ln TVE / ln MAE vs eps for frequencies and means; solid = projected,
    dashed = raw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    cells: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        cells[(r["data"], r["n"], r["d"], r["s"])].append(r)
    paths = []
    for (data, n, d, s), group in sorted(cells.items()):
        fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
        names = sorted({r["mechanism"] for r in group}, key=_mech_order)
        for ax, (target, metric) in zip(axes.ravel(), [(t, m) for t in ("freq", "mean") for m in ("tve", "mae")],
                                        strict=True):
            for i, name in enumerate(names):
                pts = sorted((r["eps"], r[f"ln_{target}_{metric}_proj"], r[f"ln_{target}_{metric}_raw"])
                             for r in group if r["mechanism"] == name)
                eps, proj, raw = zip(*pts, strict=True)
                color = f"C{i}"
                ax.plot(eps, proj, "-o", color=color, ms=3, label=f"{name} (proj)")
                ax.plot(eps, raw, "--", color=color, alpha=0.6, label=f"{name} (raw)")
            ax.set_xscale("log")
            ax.set_title(f"{'frequency' if target == 'freq' else 'mean'} {metric.upper()}")
            ax.set_ylabel(f"mean ln({metric.upper()})")
            ax.grid(alpha=0.3)
        for ax in axes[1]:
            ax.set_xlabel("epsilon")
        axes[0, 0].legend(fontsize=7, ncol=2)
        fig.suptitle(f"{data} data, n={n}, d={d}, s={s}, reps={group[0]['reps']}")
        fig.tight_layout()
        path = out / f"kv_{data}_n{n}_d{d}_s{s}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(float(x)) for x in text.split(",") if x)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small grid: n=1e4, d=256 (all s, all budgets), ~30 s")
    ap.add_argument("--n", type=_ints, default=None, help="comma list (default 1e4,1e5)")
    ap.add_argument("--d", type=_ints, default=None, help="comma list (default 256,512)")
    ap.add_argument("--s", type=_ints, default=None, help="comma list (default 4,8,16,32)")
    ap.add_argument("--eps", type=_floats, default=None, help="comma list (default [CoCo]'s nine budgets)")
    ap.add_argument("--mechanisms", default=",".join(DEFAULT_MECHANISMS), help="comma list (+ pckv-agrr)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per setting ([CoCo] used 100)")
    ap.add_argument("--data", default="uniform", help="uniform, skewed or uniform,skewed")
    ap.add_argument("--t-rule", default="paper", choices=("paper", "variance"), help="Collision/CoCo t")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1, help="worker processes over (n, d, s, rep) cells")
    ap.add_argument("--out", type=Path, default=None, help="directory for PNG plots and CSVs")
    ap.add_argument("--quiet", action="store_true", help="no per-setting table, headline only")
    args = ap.parse_args(argv)
    grid = dict(GRID_QUICK if args.quick else GRID_003)
    for key in grid:
        if getattr(args, key) is not None:
            grid[key] = getattr(args, key)
    mechanisms = tuple(m for m in args.mechanisms.split(",") if m)
    data = tuple(x for x in args.data.split(",") if x)
    cells = len(data) * len(grid["n"]) * len(grid["d"]) * len(grid["s"]) * args.reps
    done = [0]
    t0 = time.perf_counter()

    def progress(cell: list[dict[str, Any]]) -> None:
        done[0] += 1
        r = cell[0]
        print(f"[{done[0]}/{cells}] {r['data']} n={r['n']} d={r['d']} s={r['s']} rep={r['rep']} "
              f"{time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)

    records = run_grid(grid["n"], grid["d"], grid["s"], grid["eps"], mechanisms, args.reps, data, args.t_rule,
                       args.seed, args.jobs, progress)
    wall = time.perf_counter() - t0
    rows = summarise(records)
    if not args.quiet:
        print(format_table(rows))
    print()
    print(format_headline(rows))
    per_mech: dict[str, float] = defaultdict(float)
    for rec in records:
        per_mech[rec["mechanism"]] += rec["encode_s"] + rec["decode_s"]
    print(f"\nWall time {wall:.1f} s (jobs={args.jobs}); summed encode+decode per mechanism: "
          + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(per_mech.items(), key=lambda kv: _mech_order(kv[0]))))
    if args.out is not None:
        write_csv(args.out / "kv_compare_runs.csv", records)
        write_csv(args.out / "kv_compare_summary.csv", rows)
        paths = plot(rows, args.out)
        print(f"Wrote {len(paths)} plots and 2 CSVs to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
