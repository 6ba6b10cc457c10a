"""The shuffled k-RR histogram against the §1.2 pair, exactly: what the bins outside the victim's two leak.

A crowd of 15 k-RR reports (d = 4, eps0 = 2): the victim holds 0 or 1, the 14 others hold 2. The §1.2 pair
is exactly the law of the two bins (c0, c1) the victim moves between; the analyst also sees (c2, c3), and
there the victim's leftover law (uniform on {2, 3}) differs from the others' ((p, q)/(p + q)), so the split
of c2 and c3 says something about whether the victim's report is in {0, 1}. This enumerates all 816
histograms, computes the exact central epsilon of the full view and of the (c0, c1) view at delta = 1e-3,
and prints them beside the ledger's claim (``shuffle_bound.epsilon_central``).

    .venv/bin/python benchmarks/shuffle_rest_leak.py
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

from transforms.privacy.mixture import alpha_grr
from transforms.privacy.shuffle_bound import epsilon_central

D, N, DELTA = 4, 15, 1e-3


def laws(eps0: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    p, q = math.exp(eps0) / (math.exp(eps0) + D - 1), 1.0 / (math.exp(eps0) + D - 1)
    others = [q, q, p, q]
    hists = np.array([h for h in itertools.product(range(N + 1), repeat=D) if sum(h) == N])
    out = []
    for victim in (0, 1):
        mine = [p if r == victim else q for r in range(D)]
        total = np.zeros(len(hists))
        for r in range(D):
            rest = hists.copy()
            rest[:, r] -= 1
            ok = (rest >= 0).all(axis=1)
            total[ok] += mine[r] * multinomial.pmf(rest[ok], N - 1, others)
        out.append(total)
    return hists, out[0], out[1]


def epsilon(p: np.ndarray, q: np.ndarray, delta: float) -> float:
    lo, hi = 0.0, 20.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if np.maximum(p - math.exp(mid) * q, 0.0).sum() > delta else (lo, mid)
    return hi


def main() -> None:
    results = {}
    for eps0 in (1.0, 2.0, 3.0):
        hists, p, q = laws(eps0)
        p2, q2 = defaultdict(float), defaultdict(float)
        for h, a, b in zip(map(tuple, hists), p, q, strict=True):
            p2[h[:2]] += a
            q2[h[:2]] += b
        keys = list(p2)
        results[f"eps0={eps0:g}"] = {
            "claim": epsilon_central(N, alpha_grr(eps0, D), eps0, DELTA),
            "exact_two_bins": epsilon(np.array([p2[k] for k in keys]), np.array([q2[k] for k in keys]), DELTA),
            "exact_full_histogram": epsilon(p, q, DELTA)}
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
