"""Synthetic client populations with a known truth (pure numpy; no Kafka, no Beam).

A population is who reports what and when: per client an id, a raw value of the spec's kind, an event
time spread uniformly over whole windows and, if the spec partitions crowds, a crowd id. ``synthesize``
draws one for any analysis kind (``VALUE_LAWS``); ``truth_table`` computes exactly what the estimates of
each window and crowd must match (``TRUTHS``), item by item, with the same item names and indices as the
analyzer's Estimate rows; ``avro_value`` is how a device would put the raw value in a TelemetryEvent.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from pipelines.demo.grid_image import grid_density
from pipelines.demo.value_laws import (
    heavy_hitter_truth,
    kv_truth,
    kv_values,
    latency_values,
    quantile_truth,
    tree_truth,
    url_values,
    vector_truth,
    vector_values,
)
from transforms.mechanisms.randomness import os_entropy_rng, seeded_rng
from transforms.spec import AnalysisSpec

DISTRIBUTIONS = ("zipf", "uniform")


@dataclass(frozen=True)
class Population:
    """Who reports what and when: the ground truth of a simulation."""

    client_ids: np.ndarray  # str objects
    values: Any  # per kind: category indices (int array), numbers, dicts, vectors (2-D array), strings
    event_times_ms: np.ndarray
    window_ms: int
    crowd_ids: np.ndarray | None = None  # str objects, when the spec partitions crowds

    def __len__(self) -> int:
        return len(self.event_times_ms)


def category_law(d: int, distribution: str, zipf_s: float) -> np.ndarray:
    """Probabilities of the d categories: Zipf(s) by rank (item 0 most frequent) or uniform."""
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"distribution must be one of {', '.join(DISTRIBUTIONS)}, got {distribution!r}")
    if distribution == "uniform":
        return np.full(d, 1.0 / d)
    weights = 1.0 / np.arange(1, d + 1, dtype=float) ** zipf_s
    return weights / weights.sum()


@dataclass(frozen=True)
class Law:
    """How values are drawn: the distribution family and its skew (kinds interpret them their own way)."""

    distribution: str = "zipf"
    zipf_s: float = 1.1


def histogram_values(spec: AnalysisSpec, n: int, rng: np.random.Generator, law: Law) -> np.ndarray:
    """Category indices; a grid domain draws cells from an image-like density instead of Zipf."""
    grid = spec.domain.get("grid")
    p = grid_density(*grid).ravel() if grid else category_law(spec.d, law.distribution, law.zipf_s)
    return rng.choice(spec.d, size=n, p=p).astype(np.int64)


ValueLaw = Callable[[AnalysisSpec, int, np.random.Generator, Law], Any]
VALUE_LAWS: dict[str, ValueLaw] = {"histogram": histogram_values, "kv_mean": kv_values,
                                    "vector_mean": vector_values, "range": latency_values,
                                    "quantile": latency_values, "heavy_hitters": url_values}


def recent_windows_start(window_ms: int, windows: int, now_ms: int | None = None) -> int:
    """Start of ``windows`` whole windows (aligned to the spec's window size) ending at the start of the
    current window: the recent past, so a simulation looks like live telemetry that just closed."""
    now = int(time.time() * 1000) if now_ms is None else int(now_ms)
    return (now // window_ms - windows) * window_ms


def synthesize(spec: AnalysisSpec, n: int, *, distribution: str = "zipf", zipf_s: float = 1.1, windows: int = 1,
               start_ms: int | None = None, seed: int | None = None, crowds: tuple[str, ...] = ()) -> Population:
    """Draw n clients (seeded only for tests and reproducible simulations; OS entropy otherwise).

    ``crowds`` names the crowd ids clients are spread over (uniformly) when the spec partitions crowds;
    by default two versions, ``v1`` and ``v2``. Event times fall in ``windows`` whole windows from
    ``start_ms`` (default: the last ``windows`` complete windows before now); client ids carry a random
    prefix, fresh per call.
    """
    if n < 1 or windows < 1:
        raise ValueError("need at least one client and one window")
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"distribution must be one of {', '.join(DISTRIBUTIONS)}, got {distribution!r}")
    if spec.kind not in VALUE_LAWS:
        raise ValueError(f"no synthetic population for {spec.kind} analyses")
    rng = seeded_rng(seed) if seed is not None else os_entropy_rng()
    window_ms = spec.window_seconds * 1000
    if start_ms is None:
        start_ms = recent_windows_start(window_ms, windows)
    values = VALUE_LAWS[spec.kind](spec, n, rng, Law(distribution, zipf_s))
    window_index = rng.integers(0, windows, size=n)
    times = start_ms + window_index * window_ms + rng.integers(0, window_ms, size=n)
    # A fresh prefix per population: two simulations on one topic are different clients, not duplicates
    # (drawn last, so a seed reproduces the same values and times as before).
    prefix = rng.bytes(4).hex()
    ids = np.array([f"client-{prefix}-{i:08d}" for i in range(n)], dtype=object)
    crowd_ids = None
    if spec.crowd.partition is not None:
        names = np.array(crowds or ("v1", "v2"), dtype=object)
        crowd_ids = names[rng.integers(0, len(names), size=n)]
    return Population(ids, values, times.astype(np.int64), window_ms, crowd_ids)


def avro_value(spec: AnalysisSpec, value: Any) -> Any:
    """A raw value as a TelemetryEvent carries it (categories by name, vectors as DenseVector records)."""
    if spec.kind == "histogram":
        return spec.categories[int(value)]
    if spec.kind == "vector_mean":
        return ("esa.telemetry.DenseVector", {"values": [float(x) for x in value]})
    if isinstance(value, np.generic):
        return value.item()
    return value


def histogram_truth(spec: AnalysisSpec, values: Any) -> dict[str, np.ndarray]:
    counts = np.bincount(np.asarray(values, dtype=np.int64), minlength=spec.d)
    return {"item": np.asarray(spec.categories, dtype=object), "count": counts, "truth": counts / counts.sum()}


TruthOf = Callable[[AnalysisSpec, Any], dict[str, np.ndarray]]
TRUTHS: dict[str, TruthOf] = {"histogram": histogram_truth, "kv_mean": kv_truth, "vector_mean": vector_truth,
                              "range": tree_truth, "quantile": quantile_truth, "heavy_hitters": heavy_hitter_truth}


def _subset(values: Any, mask: np.ndarray) -> Any:
    if isinstance(values, np.ndarray):
        return values[mask]
    return [v for v, keep in zip(values, mask.tolist(), strict=True) if keep]


def truth_table(spec: AnalysisSpec, population: Population) -> pa.Table:
    """The true value of every item in every (window, crowd): what the estimates must match.

    Columns: window_start, window_end, crowd_id, item, item_index, truth (plus kind-specific ones, e.g.
    a histogram's count and frequency; a range tree's ``population`` and ``scales_with_n``: counts that
    ``pipelines.demo.compare`` rescales to the clients the shuffler released).
    """
    starts = (population.event_times_ms // population.window_ms) * population.window_ms
    crowd_ids = population.crowd_ids if population.crowd_ids is not None else np.full(len(starts), None)
    columns: dict[str, list] = {}
    for start in np.unique(starts):
        for crowd in dict.fromkeys(crowd_ids[starts == start].tolist()):
            mask = (starts == start) & (crowd_ids == crowd) if crowd is not None else starts == start
            truth = TRUTHS[spec.kind](spec, _subset(population.values, mask))
            size = len(truth["truth"])
            base = {"window_start": [int(start)] * size, "window_end": [int(start + population.window_ms)] * size,
                    "crowd_id": [crowd] * size, "item_index": truth.get("item_index", np.arange(size)).tolist()}
            for key, value in {**base, **{k: v for k, v in truth.items() if k != "item_index"}}.items():
                columns.setdefault(key, []).extend(value.tolist() if isinstance(value, np.ndarray) else value)
    if spec.kind == "histogram":
        columns["frequency"] = list(columns["truth"])
    return pa.table(columns)
