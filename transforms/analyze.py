"""Analyze stage: shuffled batches -> Estimate rows with standard errors and a privacy ledger.

One CombineFn per (window, spec, channel) folds ``ShuffledBatch`` arrays into the mechanism's count
accumulator (memory O(state), never O(n)); the finished accumulator is decoded once into per-item
estimates, each row carrying the closed-form standard error, the number of reports released, the local
epsilon and the tight central epsilon of the shuffle bound for exactly that many reports.

The analyzer does not learn how many reports the shuffler deleted: ``n_deleted`` is null, because
publishing it next to ``n_reports`` would reveal the exact crowd size that the randomized deletion hides
(the shuffler's counters report deletions to its operator).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.transforms import window

from schemas import SCHEMA_VERSION
from transforms.mechanisms.base import Accumulator, Mechanism
from transforms.privacy.shuffle_bound import epsilon_central
from transforms.records import ShuffledBatch
from transforms.spec import AnalysisSpec

NAMESPACE = "esa"


class FrequencyCombineFn(beam.CombineFn):
    """ShuffledBatch* -> the mechanism's accumulator (count arrays), mergeable in any order."""

    def __init__(self, mechanism: Mechanism):
        self._mechanism = mechanism

    def create_accumulator(self) -> Accumulator:
        return self._mechanism.new_accumulator()

    def add_input(self, accumulator: Accumulator, batch: ShuffledBatch) -> Accumulator:
        accumulator.add(batch.reports)
        return accumulator

    def merge_accumulators(self, accumulators: Iterable[Accumulator]) -> Accumulator:
        it = iter(accumulators)
        merged = next(it)
        for other in it:
            merged.merge(other)
        return merged

    def extract_output(self, accumulator: Accumulator) -> Accumulator:
        return accumulator


def central_epsilon(mechanism: Mechanism, n: int, delta: float) -> float:
    """Tight shuffle bound (MECHANISMS.md §1.6) for n shuffled reports; no amplification below 2."""
    if n < 2:
        return float(mechanism.epsilon_local)
    return float(epsilon_central(n, mechanism.mixture_alpha, mechanism.epsilon_local, delta))


def estimate_rows(spec: AnalysisSpec, channel: int, accumulator: Accumulator, window_start_ms: int,
                  window_end_ms: int) -> list[dict[str, Any]]:
    """Decode one crowd's accumulator into Estimate records (schemas/Estimate.avsc), one per item."""
    mechanism = spec.randomizer
    result = accumulator.estimate()
    eps_c = central_epsilon(mechanism, result.n, spec.delta)
    parameters = json.dumps(mechanism.parameters(), sort_keys=True)
    common = {
        "schema_version": SCHEMA_VERSION,
        "spec_id": spec.spec_id,
        "analysis": spec.name,
        "window_start": window_start_ms,
        "window_end": window_end_ms,
        "channel": channel,
        "n_reports": int(result.n),
        "n_deleted": None,
        "eps_local": float(mechanism.epsilon_local),
        "eps_central": eps_c,
        "delta": float(spec.delta),
        "mechanism": mechanism.name,
        "parameters": parameters,
    }
    return [
        {**common, "item": item, "item_index": i, "estimate": float(f), "stderr": float(se)}
        for i, (item, f, se) in enumerate(zip(spec.categories, result.frequency, result.stderr, strict=True))
    ]


class EstimateRowsFn(beam.DoFn):
    """((spec_id, channel), accumulator) -> Estimate records of that window."""

    def __init__(self, spec: AnalysisSpec):
        self._spec = spec
        self._analyzed = Metrics.counter(NAMESPACE, "reports_analyzed")
        self._windows = Metrics.counter(NAMESPACE, "windows_estimated")

    def process(self, keyed: tuple[tuple[str, int], Accumulator],
                win: window.BoundedWindow = beam.DoFn.WindowParam) -> Iterator[dict[str, Any]]:
        (_, channel), accumulator = keyed
        if accumulator.n == 0:
            return
        self._analyzed.inc(accumulator.n)
        self._windows.inc()
        yield from estimate_rows(self._spec, channel, accumulator, win.start.micros // 1000,
                                 win.end.micros // 1000)


class Analyze(beam.PTransform):
    """ShuffledBatches of one spec -> Estimate records, per window and channel."""

    def __init__(self, spec: AnalysisSpec):
        super().__init__()
        self._spec = spec

    def expand(self, batches: beam.PCollection) -> beam.PCollection:
        return (
            batches
            | "KeyByCrowd" >> beam.Map(lambda b: ((b.spec_id, b.channel), b))
            | "Accumulate" >> beam.CombinePerKey(FrequencyCombineFn(self._spec.randomizer))
            | "Estimates" >> beam.ParDo(EstimateRowsFn(self._spec))
        )
