"""Top-k heavy hitters: our prefix-tree mechanism (docs/mathematics.md §6) against pure-ldp's PEM.

Data: n clients with Zipf(``--zipf``) ranks over ``2^--rank-bits`` ranks, hashed to 32-bit items with
``item_hash`` (so the item domain is 2^32 and neither method may enumerate it). Both methods are eps-LDP
per client and send ONE message on a uniformly drawn level (group), OLH inside:

* ``ours-8`` / ``ours-4``: ``PrefixHeavyHitters(eps, item_bits=32, level_bits=8 | 4)`` (4 or 8 levels,
  ``width`` = 32 candidates kept per level), top k of ``estimate()``; ``ours-8t``: the same collection as
  ``ours-8`` decoded with ``estimate(exact=False)`` (textbook OLH estimates, no candidate-restricted
  correction). ``--quick`` skips ``ours-8``: its correction solves a 8192-candidate system per level (CG over
  seed_family x 8192 cells), tens of seconds per decode whatever n;
* ``pem``: ``pure_ldp.heavy_hitters.prefix_extending`` PEMClient/PEMServer on the 32-bit strings, start
  length ``--pem-start`` and ``--pem-fragment`` bits per step (default 4 + 4: 7 groups; the first group
  decodes 2^8 prefixes, later ones k * 2^4), keeping the top k at every step (``find_heavy_hitters(k)``).

pure-ldp's OLH server (``LHServer``) keeps a count per domain element and loops over the whole domain for
every report, and ``FreqOracleServer`` allocates ``zeros(d)``: for the 2^32-string last group that is
32 GiB. PEM is therefore run with :class:`LazyOLHServer`, a subclass that stores the reports and computes
LHServer's estimate ``(g C - n) / (p g - 1)`` only for the candidates PEM asks about (identical numbers:
:func:`check_lazy_server`, printed by every run, compares the two on a small domain).

Metrics per k: precision = fraction of the returned items whose true count reaches the k-th largest true
count (ties count as hits), recall = hits / k (they coincide when k items come back), ``relerr`` = median
|estimate - true| / true over the hits; client seconds (randomize + aggregate) and server seconds (decode;
ours decodes once for both k). Medians over ``--reps`` repetitions.

    .venv/bin/python benchmarks/heavy_hitters.py --quick   # one repetition, no ours-8: ~1.5 minutes
    .venv/bin/python benchmarks/heavy_hitters.py           # 3 repetitions: ~15 minutes
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from functools import cache  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere

from transforms.mechanisms.heavy_hitters.prefix_tree import PrefixHeavyHitters, item_hash  # noqa: E402
from transforms.mechanisms.randomness import seeded_rng  # noqa: E402

ITEM_BITS = 32
Result = dict[int, tuple[np.ndarray, np.ndarray]]  # k -> (items best first, estimated counts)


@cache
def lazy_olh_server() -> type:
    """pure-ldp's OLH server with lazy decoding: stores (y, seed) and evaluates only the queried items.

    Built on first use so that this module (and its smoke test) imports without the ``bench`` extra.
    """
    import xxhash
    from pure_ldp.frequency_oracles.local_hashing import LHServer

    class LazyOLHServer(LHServer):
        def reset(self) -> None:
            self.seeds: list[int] = []
            self.ys: list[int] = []
            self.n = 0
            self.last_estimated = 0

        def aggregate(self, priv_data: tuple[int, int]) -> None:
            y, seed = priv_data
            self.seeds.append(seed)
            self.ys.append(y)
            self.n += 1

        def _update_estimates(self) -> None:
            return None

        def estimate(self, data: Any, suppress_warnings: bool = False) -> float:
            key, g, h = str(self.index_mapper(data)), self.g, xxhash.xxh32_intdigest
            support = sum(1 for seed, y in zip(self.seeds, self.ys, strict=True) if h(key, seed) % g == y)
            return (g * support - self.n) / (self.p * g - 1)

    return LazyOLHServer


def check_lazy_server(eps: float = 3.0, d: int = 64, n: int = 500, seed: int = 5) -> float:
    """Largest |difference| between LazyOLHServer's and pure-ldp's LHServer's estimates of every item of a small
    domain, on the same privatised reports (0 up to float rounding)."""
    from pure_ldp.frequency_oracles.local_hashing import LHClient, LHServer

    random.seed(seed)
    np.random.seed(seed)
    ident = lambda x: x  # noqa: E731
    client = LHClient(eps, d, use_olh=True, index_mapper=ident)
    eager, lazy = LHServer(eps, d, use_olh=True, index_mapper=ident), lazy_olh_server()(eps, d, use_olh=True,
                                                                                       index_mapper=ident)
    for value in np.random.randint(0, d // 4, n).tolist():
        report = client.privatise(value)
        eager.aggregate(report)
        lazy.aggregate(report)
    items = list(range(d))
    a = eager.estimate_all(items, suppress_warnings=True)
    b = lazy.estimate_all(items, suppress_warnings=True)
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


def zipf_items(n: int, s: float, rank_bits: int, rng: np.random.Generator) -> np.ndarray:
    """n items: Zipf(s) ranks 1..2^rank_bits (inverse CDF), hashed to ITEM_BITS bits."""
    w = np.arange(1, (1 << rank_bits) + 1, dtype=np.float64) ** -s
    cdf = np.cumsum(w)
    ranks = np.minimum(np.searchsorted(cdf / cdf[-1], rng.random(n), "right"), w.size - 1) + 1
    return item_hash(ranks.astype(np.int64), ITEM_BITS)


def run_ours(items: np.ndarray, eps: float, ks: list[int], level_bits: int, rng: np.random.Generator,
             exact: tuple[bool, ...] = (True,)) -> list[tuple[Result, float, float]]:
    """One collection, decoded once per ``exact`` flag (the candidate-restricted correction, or textbook)."""
    t0 = time.perf_counter()
    mech = PrefixHeavyHitters(eps, item_bits=ITEM_BITS, level_bits=level_bits, width=max(32, *ks))
    acc = mech.new_accumulator()
    step = 1 << 16
    for start in range(0, items.size, step):
        part = items[start : start + step]
        acc.add(mech.encode_messages(part, rng)[0], part.size)
    t_client = time.perf_counter() - t0
    out = []
    for flag in exact:
        t1 = time.perf_counter()
        hh = acc.estimate(exact=flag)
        out.append(({k: (hh.items[:k], hh.count[:k]) for k in ks}, t_client, time.perf_counter() - t1))
    return out


def run_pem(items: np.ndarray, eps: float, ks: list[int], start: int, fragment: int,
            seed: int) -> tuple[Result, float, float]:
    from pure_ldp.heavy_hitters.prefix_extending import PEMClient, PEMServer

    random.seed(seed)  # pure-ldp draws from the global generators: seeded so that runs repeat
    np.random.seed(seed % 2**32)
    t0 = time.perf_counter()
    client = PEMClient(eps, start, ITEM_BITS, fragment)
    server = PEMServer(eps, start, ITEM_BITS, fragment, fo_server=lazy_olh_server()(eps, 2, use_olh=True))
    for value in items.tolist():
        server.aggregate(client.privatise(format(value, f"0{ITEM_BITS}b")))
    t1 = time.perf_counter()
    out: Result = {}
    for k in ks:
        found, freq = server.find_heavy_hitters(k=k)
        out[k] = (np.array([int(f, 2) for f in found], dtype=np.uint64), np.asarray(freq, dtype=np.float64))
    return out, t1 - t0, time.perf_counter() - t1


def score(found: np.ndarray, est: np.ndarray, items: np.ndarray, k: int) -> dict[str, float]:
    values, counts = np.unique(items, return_counts=True)
    kth = np.sort(counts)[::-1][min(k, counts.size) - 1]
    true = dict(zip(values.tolist(), counts.tolist(), strict=True))
    t = np.array([true.get(int(v), 0) for v in found], dtype=np.float64)
    hit = t >= kth
    rel = np.abs(est[hit] - t[hit]) / t[hit] if hit.any() else np.array([np.nan])
    return {"precision": float(hit.mean()) if found.size else 0.0, "recall": min(int(hit.sum()), k) / k,
            "relerr": float(np.median(rel))}


def _median(values: list[float]) -> float:
    """Median ignoring NaN (relerr of a run without hits); NaN when every run had none."""
    finite = [v for v in values if not np.isnan(v)]
    return float(np.median(finite)) if finite else float("nan")


def run_grid(ns: list[int], epsilons: list[float], ks: list[int], reps: int, args: argparse.Namespace,
             pem: bool = True, quick: bool = False) -> list[dict]:
    rows = []
    for n in ns:
        for eps in epsilons:
            per: dict[tuple[str, int], list[dict[str, float]]] = {}
            for rep in range(reps):
                rng = seeded_rng(args.seed + 1000 * rep + n + int(10 * eps))  # a simulation: seeded on purpose
                items = zipf_items(n, args.zipf, args.rank_bits, rng)
                runs = {"ours-4": run_ours(items, eps, ks, 4, rng)[0]}
                flags = (False,) if quick else (False, True)
                runs.update(zip(("ours-8t", "ours-8"), run_ours(items, eps, ks, 8, rng, flags), strict=False))
                if pem:
                    runs["pem"] = run_pem(items, eps, ks, args.pem_start, args.pem_fragment, args.seed + rep)
                for name, (found, t_client, t_server) in runs.items():
                    for k in ks:
                        s = score(*found[k], items, k)
                        per.setdefault((name, k), []).append({**s, "client_s": t_client, "server_s": t_server})
            for (name, k), runs_k in sorted(per.items(), key=lambda kv: (kv[0][1], kv[0][0])):
                med = {key: _median([r[key] for r in runs_k]) for key in runs_k[0]}
                rows.append({"n": n, "eps": eps, "k": k, "method": name, **med})
                print(f"{n:>7} {eps:>4g} {k:>3} {name:<7} {med['precision']:>9.2f} {med['recall']:>7.2f} "
                      f"{med['relerr']:>7.3f} {med['client_s']:>9.2f} {med['server_s']:>9.2f}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one repetition, without ours-8 (~1.5 minutes)")
    parser.add_argument("--n", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--eps", type=float, nargs="+", default=[2.0, 4.0, 6.0])
    parser.add_argument("--k", type=int, nargs="+", default=[10, 20])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--rank-bits", type=int, default=20, help="Zipf support: 2^rank_bits ranks")
    parser.add_argument("--pem-start", type=int, default=4)
    parser.add_argument("--pem-fragment", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-pem", action="store_true", help="ours only (no pure-ldp needed)")
    args = parser.parse_args(argv)
    reps = 1 if args.quick else args.reps
    print(f"top-k over Zipf({args.zipf:g}) on 2^{args.rank_bits} ranks hashed to {ITEM_BITS}-bit items; "
          f"PEM start={args.pem_start} fragment={args.pem_fragment}; medians of {reps} repetition(s)")
    header = (f"{'n':>7} {'eps':>4} {'k':>3} {'method':<7} {'precision':>9} {'recall':>7} {'relerr':>7} "
              f"{'client s':>9} {'server s':>9}")
    print(header)
    print("-" * len(header))
    if not args.no_pem:
        print(f"lazy OLH server vs pure-ldp LHServer on a 64-item domain: max |estimate difference| = "
              f"{check_lazy_server():.2e}")
    run_grid(args.n, args.eps, args.k, reps, args, pem=not args.no_pem, quick=args.quick)
    print("\nprecision/recall: hits = returned items whose true count reaches the k-th largest; relerr: median "
          "|est - true| / true over hits; client s: randomize + aggregate all n (pure-ldp: one Python call per "
          "client); server s: decode (ours once for both k, PEM per k, with the lazy OLH server).")


if __name__ == "__main__":
    main()
