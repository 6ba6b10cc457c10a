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

It also prints a k-RR-specific bound that is sound but not used by the product yet (the "blanket-
conditioned pair"): write k-RR as R(x) = gamma Unif[d] + (1 - gamma) delta_x, gamma = d/(e^eps0 + d - 1)
(Balle, Bell, Gascon, Nissim, "The Privacy Blanket of the Shuffle Model", CRYPTO 2019) and reveal the number
S of other clients whose report is uniform. The histogram is a post-processing of (S, a, b): a, b the
reports equal to 0 and 1 among those S and the victim (the rest are uniform on {2..d-1} for the victim too,
and the non-uniform others report their own values, which the simulator knows). Given S, (a, b) is a clone
pair whose S others are clones with probability 2/d and whose victim is (1, 0) / (0, 1) / neither with
probability p / q / (d - 2) q, so delta(eps) = sum_S Pr[S] D_S(eps), computed exactly below.

    .venv/bin/python benchmarks/shuffle_rest_leak.py           # small crowds, seconds
    .venv/bin/python benchmarks/shuffle_rest_leak.py --large   # also d = 8, n = 5e4, delta = 1e-6 (~15 min)
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy.stats import binom, multinomial

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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


def conditioned_pair_divergence(others: int, clone: float, w1: float, w2: float, w0: float, e_c: float) -> float:
    """Hockey-stick divergence of the clone pair with ``others`` clients, each a clone w.p. ``clone``, and a
    victim at (1, 0) / (0, 1) / (0, 0) w.p. w1 / w2 / w0 (w1, w2 swapped under Q), by the O(n) tail sum."""
    m = np.arange(1, others + 2)
    b_m, b_m1 = binom.pmf(m, others, clone), binom.pmf(m - 1, others, clone)
    a1, a2 = b_m * w0 / 2 + b_m1 * w1, b_m * w0 / 2 + b_m1 * w2
    gap = a1 - e_c * a2
    live = gap > 0
    if not live.any():
        return 0.0
    m, a1, a2, gap = m[live], a1[live], a2[live], gap[live]
    ratio = (e_c * a1 - a2) / gap
    x = np.floor(np.minimum(m * ratio / (1 + ratio), m)).astype(np.int64) + 1
    tail_u, tail_w = binom.sf(x - 2, m - 1, 0.5), binom.sf(x - 1, m - 1, 0.5)
    return float(np.sum(np.where(x > m, 0.0, gap * tail_u + (a2 - e_c * a1) * tail_w)))


def blanket_conditioned_epsilon(d: int, n: int, eps0: float, delta: float, window_sds: float = 12.0) -> float:
    """The k-RR bound of the module docstring (S outside a window of Bin(n-1, gamma) counted as delta)."""
    q = 1.0 / (math.exp(eps0) + d - 1)
    p, gamma = math.exp(eps0) * q, d * q
    mean, sd = (n - 1) * gamma, math.sqrt((n - 1) * gamma * (1 - gamma))
    lo, hi = max(0, math.floor(mean - window_sds * sd)), min(n - 1, math.ceil(mean + window_sds * sd))
    weights = binom.pmf(np.arange(lo, hi + 1), n - 1, gamma)
    outside = float(binom.cdf(lo - 1, n - 1, gamma) + binom.sf(hi, n - 1, gamma))

    def divergence(eps_c: float) -> float:
        e_c = math.exp(eps_c)
        return outside + sum(w * conditioned_pair_divergence(s, 2.0 / d, p, q, (d - 2) * q, e_c)
                             for s, w in zip(range(lo, hi + 1), weights, strict=True))

    low, high = 0.0, eps0
    if divergence(high) > delta:
        return eps0
    for _ in range(30):
        middle = 0.5 * (low + high)
        low, high = (low, middle) if divergence(middle) <= delta else (middle, high)
    return high


def main() -> None:
    results: dict[str, dict[str, object]] = {}
    for d, n, eps0 in SETTINGS:
        row: dict[str, object] = {
            "pair_at_krr_alpha (old claim)": round(pair_claim(n, alpha_grr(eps0, d), eps0, DELTA), 4),
            "certified claim": round(epsilon_central(n, alpha_grr(eps0, d), eps0, DELTA), 4),
            "blanket-conditioned pair (sound, not used yet)": round(blanket_conditioned_epsilon(d, n, eps0, DELTA), 4)}
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
            "blanket-conditioned pair (sound, not used yet)": round(blanket_conditioned_epsilon(d, n, eps0, delta),
                                                                    5)}
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
