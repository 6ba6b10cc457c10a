"""Synthetic client populations with a known truth (pure numpy; no Kafka, no Beam).

Clients hold one category each, drawn from a Zipf or uniform law over the spec's domain, with event
times spread uniformly over whole windows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from transforms.mechanisms.randomness import os_entropy_rng, seeded_rng
from transforms.spec import AnalysisSpec

DISTRIBUTIONS = ("zipf", "uniform")


@dataclass(frozen=True)
class Population:
    """Who reports what and when: the ground truth of a simulation."""

    client_ids: np.ndarray  # str objects
    values: np.ndarray  # category indices
    event_times_ms: np.ndarray
    window_ms: int

    def __len__(self) -> int:
        return len(self.values)


def category_law(d: int, distribution: str, zipf_s: float) -> np.ndarray:
    """Probabilities of the d categories: Zipf(s) by rank (item 0 most frequent) or uniform."""
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"distribution must be one of {', '.join(DISTRIBUTIONS)}, got {distribution!r}")
    if distribution == "uniform":
        return np.full(d, 1.0 / d)
    weights = 1.0 / np.arange(1, d + 1, dtype=float) ** zipf_s
    return weights / weights.sum()


def synthesize(spec: AnalysisSpec, n: int, *, distribution: str = "zipf", zipf_s: float = 1.1, windows: int = 1,
               start_ms: int | None = None, seed: int | None = None) -> Population:
    """Draw n clients (seeded only for tests and reproducible simulations; OS entropy otherwise)."""
    if n < 1 or windows < 1:
        raise ValueError("need at least one client and one window")
    rng = seeded_rng(seed) if seed is not None else os_entropy_rng()
    window_ms = spec.window_seconds * 1000
    if start_ms is None:  # the last complete window before the Unix time 1.8e12 ms keeps outputs comparable
        start_ms = (1_800_000_000_000 // window_ms) * window_ms
    values = rng.choice(spec.d, size=n, p=category_law(spec.d, distribution, zipf_s))
    window_index = rng.integers(0, windows, size=n)
    times = start_ms + window_index * window_ms + rng.integers(0, window_ms, size=n)
    ids = np.array([f"client-{i:08d}" for i in range(n)], dtype=object)
    return Population(ids, values.astype(np.int64), times.astype(np.int64), window_ms)


def truth_table(spec: AnalysisSpec, population: Population) -> pa.Table:
    """True count and frequency of every item in every window (what the estimates must match)."""
    starts = (population.event_times_ms // population.window_ms) * population.window_ms
    columns: dict[str, list] = {k: [] for k in ("window_start", "window_end", "item", "item_index", "count",
                                                "frequency")}
    for start in np.unique(starts):
        counts = np.bincount(population.values[starts == start], minlength=spec.d)
        columns["window_start"] += [int(start)] * spec.d
        columns["window_end"] += [int(start + population.window_ms)] * spec.d
        columns["item"] += list(spec.categories)
        columns["item_index"] += list(range(spec.d))
        columns["count"] += counts.tolist()
        columns["frequency"] += (counts / counts.sum()).tolist()
    return pa.table(columns)
