"""The shuffled k-RR histogram against the clone pair, exactly: why the ledger certifies at the generic alpha.

A crowd of n k-RR reports; the victim holds 0 or 1 and the n - 1 others all hold one value v (each v in turn;
v = 0, the victim's own value, is the worst crowd found). The clone pair at k-RR's own alpha
1/(e^eps0 + d - 1) is exactly the law of the two bins (c0, c1) the victim moves between, but the analyst sees
the whole histogram, and for d >= 3 the bins outside those two say something about whether the victim's
report landed in {0, 1} (the victim's leftover law, uniform on {2, ..., d-1}, is not the others'). This
enumerates every histogram (multinomial laws, independent of the accountant), computes the exact central
epsilon of the full view and of the (c0, c1) view at delta = 1e-3, and prints them beside the pair at
k-RR's alpha (the accountant before the fix) and the certified claim (``shuffle_bound.epsilon_central``, the
pair at the generic alpha). Every exact value must stay at or below the claim.

It also prints the k-RR blanket pair the product publishes where it is smaller (``privacy.blanket_shuffle``):
write k-RR as R(x) = gamma Unif[d] + (1 - gamma) delta_x, gamma = d/(e^eps0 + d - 1)
(Balle, Bell, Gascon, Nissim, "The Privacy Blanket of the Shuffle Model", CRYPTO 2019) and reveal the number
S of other clients whose report is uniform. The histogram is a post-processing of (S, a, b): a, b the
reports equal to 0 and 1 among those S and the victim (the rest are uniform on {2..d-1} for the victim too,
and the non-uniform others report their own values, which the simulator knows). Given S, (a, b) is a clone
pair whose S others are clones with probability 2/d and whose victim is (1, 0) / (0, 1) / neither with
probability p / q / (d - 2) q, so delta(eps) = sum_S Pr[S] D_S(eps).

    .venv/bin/python benchmarks/shuffle_rest_leak.py           # small crowds, seconds
    .venv/bin/python benchmarks/shuffle_rest_leak.py --large   # also d = 8, n = 5e4, delta = 1e-6 (seconds)
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy.stats import multinomial

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transforms.privacy.blanket_shuffle import blanket_grr, epsilon_blanket_shuffle
from transforms.privacy.mixture import alpha_grr
from transforms.privacy.shuffle_bound import ClonePairDivergence, epsilon_central

DELTA = 1e-3
SETTINGS = [(4, 15, 1.0), (4, 15, 2.0), (4, 15, 3.0), (3, 15, 2.0), (5, 12, 2.0)]  # (d, n, eps0)


def laws(d: int, n: int, eps0: float, others_value: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every histogram of n reports and its probability with the victim at 0 and at 1."""
    p, q = math.exp(eps0) / (math.exp(eps0) + d - 1), 1.0 / (math.exp(eps0) + d - 1)
    others = [p if r == others_value else q for r in range(d)]
    hists = np.array([h for h in itertools.product(range(n + 1), repeat=d) if sum(h) == n])
    out = []
    for victim in (0, 1):
        mine = [p if r == victim else q for r in range(d)]
        total = np.zeros(len(hists))
        for r in range(d):
            rest = hists.copy()
            rest[:, r] -= 1
            ok = (rest >= 0).all(axis=1)
            total[ok] += mine[r] * multinomial.pmf(rest[ok], n - 1, others)
        out.append(total)
    return hists, out[0], out[1]


def epsilon(p: np.ndarray, q: np.ndarray, delta: float) -> float:
    """Smallest eps with both hockey-stick divergences <= delta (bisection, upper end)."""
    def divergence(eps: float) -> float:
        return max(np.maximum(p - math.exp(eps) * q, 0.0).sum(), np.maximum(q - math.exp(eps) * p, 0.0).sum())

    lo, hi = 0.0, 20.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if divergence(mid) > delta else (lo, mid)
    return hi


def pair_claim(n: int, alpha: float, eps0: float, delta: float) -> float:
    """The clone pair's epsilon at exactly this alpha (the accountant before the fix)."""
    divergence = ClonePairDivergence(n, alpha, eps0)
    lo, hi = 0.0, eps0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if divergence(mid) <= delta else (mid, hi)
    return hi


def blanket_pair_epsilon(d: int, n: int, eps0: float, delta: float) -> float:
    """The k-RR blanket pair of the module docstring: the product's ``blanket_shuffle`` (the fast path the
    ledger uses; the O(n^1.5) Python-loop prototype that took 15 minutes at n = 5e4 is gone)."""
    return epsilon_blanket_shuffle(n, blanket_grr(eps0, d), eps0, delta)


def main() -> None:
    results: dict[str, dict[str, object]] = {}
    for d, n, eps0 in SETTINGS:
        row: dict[str, object] = {
            "pair_at_krr_alpha (old claim)": round(pair_claim(n, alpha_grr(eps0, d), eps0, DELTA), 4),
            "certified claim": round(epsilon_central(n, alpha_grr(eps0, d), eps0, DELTA), 4),
            "blanket pair (published where smaller)": round(blanket_pair_epsilon(d, n, eps0, DELTA), 4)}
        for value in range(d):
            hists, p, q = laws(d, n, eps0, value)
            p2, q2 = defaultdict(float), defaultdict(float)
            for h, a, b in zip(map(tuple, hists), p, q, strict=True):
                p2[h[:2]] += a
                q2[h[:2]] += b
            keys = list(p2)
            row[f"others hold {value}"] = {
                "exact_two_bins": round(epsilon(np.array([p2[k] for k in keys]), np.array([q2[k] for k in keys]),
                                                DELTA), 4),
                "exact_full_histogram": round(epsilon(p, q, DELTA), 4)}
        results[f"d={d} n={n} eps0={eps0:g}"] = row
    if "--large" in sys.argv[1:]:
        d, n, eps0, delta = 8, 50_000, 2.0, 1e-6
        results[f"d={d} n={n} eps0={eps0:g} delta={delta:g}"] = {
            "pair_at_krr_alpha (old claim)": round(pair_claim(n, alpha_grr(eps0, d), eps0, delta), 5),
            "certified claim": round(epsilon_central(n, alpha_grr(eps0, d), eps0, delta), 5),
            "blanket pair (published where smaller)": round(blanket_pair_epsilon(d, n, eps0, delta), 5)}
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
