"""Analyze stage: shuffled batches -> Estimate rows with standard errors and a privacy ledger.

One CombineFn per (window, spec, crowd) folds ``ShuffledBatch`` arrays into the mechanism's count
accumulator (memory O(state), never O(n)); the finished accumulator is decoded once into per-item
estimates (``transforms.readout`` names the items of each analysis kind), each row carrying the
closed-form standard error, the raw unbiased estimate next to the post-processed one, the numbers of
messages and clients released, the local epsilon and the central epsilon for exactly that many clients.
Multi-message mechanisms are counted by their presence markers (``records.count_clients``).

The analyzer does not learn how many reports the shuffler deleted: ``n_deleted`` is null, because
publishing it next to ``n_reports`` would reveal the exact crowd size that the randomized deletion hides
(the shuffler's counters report deletions to its operator). A spec may opt in with
``[crowd] publish_deletions = true`` where the analyst is allowed to know crowd sizes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.pvalue import TaggedOutput
from apache_beam.transforms import window
from apache_beam.utils.timestamp import Timestamp

from schemas import SCHEMA_VERSION, WireFormatError, decode_record
from transforms.kafkaio import KafkaRecord
from transforms.mechanisms.base import Accumulator, Mechanism
from transforms.privacy.shuffle_bound import epsilon_central
from transforms.readout import readout, readout_parameters
from transforms.records import ShuffledBatch, SourceRef, count_clients, dead_letter, payload_from_avro, rows_to_array
from transforms.spec import AnalysisSpec

NAMESPACE = "esa"
DEAD = "dead_letters"


@dataclass
class CrowdAccumulator:
    """The mechanism's count arrays plus the deletions the shuffler published (None: not published)."""

    counts: Accumulator
    deleted: int | None = None
    messages: int = 0  # released messages folded in (presence markers included)

    @property
    def n(self) -> int:
        return self.counts.n


def _add_deleted(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a + b


class FrequencyCombineFn(beam.CombineFn):
    """ShuffledBatch* -> CrowdAccumulator (count arrays), mergeable in any order."""

    def __init__(self, mechanism: Mechanism):
        self._mechanism = mechanism

    def create_accumulator(self) -> CrowdAccumulator:
        return CrowdAccumulator(self._mechanism.new_accumulator(), deleted=0)

    def add_input(self, accumulator: CrowdAccumulator, batch: ShuffledBatch) -> CrowdAccumulator:
        if len(batch.reports):
            messages, clients = count_clients(self._mechanism, batch.reports)
            accumulator.counts.add(messages, clients)
            accumulator.messages += len(batch.reports)
        accumulator.deleted = _add_deleted(accumulator.deleted, batch.deleted)
        return accumulator

    def merge_accumulators(self, accumulators: Iterable[CrowdAccumulator]) -> CrowdAccumulator:
        it = iter(accumulators)
        merged = next(it)
        for other in it:
            merged.counts.merge(other.counts)
            merged.messages += other.messages
            merged.deleted = _add_deleted(merged.deleted, other.deleted)
        return merged

    def extract_output(self, accumulator: CrowdAccumulator) -> CrowdAccumulator:
        return accumulator


def central_epsilon(mechanism: Mechanism, n: int, delta: float, reports_per_client: int = 1) -> float:
    """Central epsilon of n shuffled clients at total ``delta`` (docs/mathematics.md §1.2; no amplification below 2).

    A mechanism with its own accounting (fragmenting, multi-message protocols) provides
    ``epsilon_central(n, delta)``. Otherwise, with up to k reports per client, a neighbouring dataset
    changes k reports: the single-report bound is computed at delta' = delta / sum_{i<k} e^{i eps_local}
    and chained over k (§1.4), which keeps the total delta within ``delta`` because the per-report
    central epsilon never exceeds eps_local.
    """
    k = reports_per_client
    eps_local = float(mechanism.epsilon_local)
    if n < 2:
        return k * eps_local
    own = getattr(mechanism, "epsilon_central", None)
    if callable(own) and k == 1:
        return float(own(n, delta))
    if k == 1:
        return float(epsilon_central(n, mechanism.mixture_alpha, eps_local, delta))
    spread = math.expm1(k * eps_local) / math.expm1(eps_local) if k * eps_local < 700 else math.inf
    delta_per_report = delta / spread  # sum_{i<k} e^{i eps_local} >= sum_{i<k} e^{i eps_c}
    if delta_per_report < 1e-300:
        return k * eps_local  # nothing certifiable: the plain composition of the local guarantees
    return k * float(epsilon_central(n, mechanism.mixture_alpha, eps_local, delta_per_report))


def estimate_rows(spec: AnalysisSpec, crowd_id: str | None, accumulator: CrowdAccumulator, window_start_ms: int,
                  window_end_ms: int) -> list[dict[str, Any]]:
    """Decode one crowd's accumulator into Estimate records (schemas/Estimate.avsc), one per item."""
    mechanism = spec.randomizer
    result = accumulator.counts.estimate()
    k = spec.max_reports_per_client
    clients = int(accumulator.n)
    common = {
        "schema_version": SCHEMA_VERSION,
        "spec_id": spec.spec_id,
        "analysis": spec.name,
        "window_start": window_start_ms,
        "window_end": window_end_ms,
        "crowd_id": crowd_id,
        "n_reports": int(accumulator.messages),
        "n_clients": clients,
        "n_deleted": accumulator.deleted,
        # replacement notion like eps_central (rappor's removal budget is in parameters); k reports compose
        "eps_local": k * float(getattr(mechanism, "epsilon_replacement", mechanism.epsilon_local)),
        "eps_central": central_epsilon(mechanism, clients, spec.delta, k),
        "delta": float(spec.delta),
        "mechanism": mechanism.name,
        "parameters": json.dumps(_parameters(spec, mechanism, result), sort_keys=True, default=str),
    }
    return [{**common, "item": item.name, "item_index": item.index, "estimate": item.estimate,
             "stderr": item.stderr, "raw_estimate": item.raw} for item in readout(spec, result)]


COLLUDING_FRACTION = 0.1  # the published what-if: this share of the crowd's devices colludes with the analyst


def _honest_crowd(spec: AnalysisSpec, mechanism: Mechanism, n: int) -> dict[str, Any]:
    """eps_central's assumption, and what it becomes when a tenth of the crowd colludes with the analyst.

    Colluding enrolled devices send reports the analyst knows, so they hide nobody: a victim is amplified only
    by the honest others. With c colluders the guarantee is the tight bound for the n - c honest reports
    (the victim's included); a lone victim among colluders keeps only its local epsilon.
    """
    colluders = math.ceil(COLLUDING_FRACTION * n)
    single = not callable(getattr(mechanism, "epsilon_central", None)) and math.isfinite(
        float(mechanism.epsilon_local))
    out: dict[str, Any] = {"eps_central_assumes": "honest crowd: the other reports of the window come from "
                                                  "devices that do not collude with the analyst"}
    if single and n >= 2:
        out["eps_central_if_10pct_collude"] = central_epsilon(mechanism, n - colluders, spec.delta,
                                                              spec.max_reports_per_client)
    return out


def _parameters(spec: AnalysisSpec, mechanism: Mechanism, result: Any) -> dict[str, Any]:
    """The mechanism's public parameters, plus the ledger details a mechanism has beyond eps_local (local
    epsilon when 1..tau report fragments are exposed; a multi-message protocol's messages, bits and
    numerical accounting) and what a stored reader needs to answer queries (``readout``)."""
    out = dict(mechanism.parameters())
    exposed = getattr(mechanism, "epsilon_exposed", None)
    if callable(exposed):
        out["epsilon_exposed"] = {str(t): float(exposed(t)) for t in range(1, mechanism.fragments + 1)}
    if hasattr(mechanism, "expected_messages"):
        out["expected_messages_per_client"] = float(mechanism.expected_messages)
    removal = getattr(mechanism, "epsilon_central_removal", None)  # privacy ledger (h-privacy): eps_central is
    if callable(removal) and int(result.n) >= 2:                     # replacement DP; [ESA]'s removal value here
        out["eps_central_removal"] = float(removal(int(result.n), spec.delta))
    if hasattr(mechanism, "epsilon_replacement"):  # eps_local is the replacement value; the removal one here
        out["eps_local_removal"] = float(mechanism.epsilon_local)
    ledger = getattr(mechanism, "ledger", None)
    if callable(ledger):
        out["ledger"] = ledger(int(result.n))
    out.update(_honest_crowd(spec, mechanism, int(result.n)))
    extra = readout_parameters(spec, result)
    if extra:
        out["readout"] = extra
    return out


class EstimateRowsFn(beam.DoFn):
    """((spec_id, crowd), accumulator) -> Estimate records of that window."""

    def __init__(self, spec: AnalysisSpec):
        self._spec = spec
        self._analyzed = Metrics.counter(NAMESPACE, "reports_analyzed")
        self._windows = Metrics.counter(NAMESPACE, "windows_estimated")

    def process(self, keyed: tuple[tuple[str, str | None], CrowdAccumulator],
                win: window.BoundedWindow = beam.DoFn.WindowParam) -> Iterator[dict[str, Any]]:
        (_, crowd), accumulator = keyed
        if accumulator.n == 0:
            return
        self._analyzed.inc(accumulator.messages)
        self._windows.inc()
        yield from estimate_rows(self._spec, crowd, accumulator, win.start.micros // 1000,
                                 win.end.micros // 1000)


def _key_by_crowd(batch: ShuffledBatch, spec_id: str) -> tuple[tuple[str, str | None], ShuffledBatch]:
    """Key a batch by its crowd, refusing batches of another spec (they would be decoded with wrong params)."""
    if batch.spec_id != spec_id:
        raise ValueError(f"a batch of spec {batch.spec_id} reached the analyzer of {spec_id}")
    return (batch.spec_id, batch.crowd_id), batch


class Analyze(beam.PTransform):
    """ShuffledBatches of one spec -> Estimate records, per window and crowd."""

    def __init__(self, spec: AnalysisSpec):
        super().__init__()
        self._spec = spec

    def expand(self, batches: beam.PCollection) -> beam.PCollection:
        return (
            batches
            | "KeyByCrowd" >> beam.Map(_key_by_crowd, self._spec.spec_id)
            | "Accumulate" >> beam.CombinePerKey(FrequencyCombineFn(self._spec.randomizer))
            | "Estimates" >> beam.ParDo(EstimateRowsFn(self._spec))
        )


class DecodeShuffledFn(beam.DoFn):
    """KafkaRecords of ShuffledReports -> one ShuffledBatch per (spec, crowd, window) of each input batch.

    For the standalone analyze job, which reads what the shuffle job released. Each batch is stamped
    just inside its window, so re-windowing puts it back in the crowd it was released from; a record of
    an unknown spec, a window end that is not a window boundary of its spec, or a payload outside the
    mechanism's domain is dead-lettered.
    """

    def __init__(self, specs: Sequence[AnalysisSpec]):
        self._specs = {s.spec_id: s for s in specs}
        self._dead = Metrics.counter(NAMESPACE, "dead_lettered")

    def process(self, element: KafkaRecord | list[KafkaRecord]) -> Iterator[Any]:
        groups: dict[tuple[str, str | None, int], list[tuple]] = {}
        for record in element if isinstance(element, list) else [element]:
            spec_id = None
            try:
                shuffled = decode_record("ShuffledReport", record.value)
                spec_id, crowd, end = shuffled["spec_id"], shuffled.get("crowd_id"), shuffled["window_end"]
                spec = self._specs.get(spec_id)
                if spec is None:
                    raise ValueError(f"unknown spec_id {spec_id!r} (known: {', '.join(sorted(self._specs))})")
                if end % (spec.window_seconds * 1000):
                    raise ValueError(f"window_end {end} is not the end of a {spec.window_seconds} s window")
                if (crowd is None) != (spec.crowd.partition is None):
                    raise ValueError(f"crowd_id {crowd!r} does not fit {spec.name}'s crowd partition "
                                     f"{spec.crowd.partition!r}")
                row = payload_from_avro(spec.randomizer, shuffled["payload"], shuffled["channel"])
            except (WireFormatError, ValueError) as err:
                self._dead.inc()
                yield TaggedOutput(DEAD, dead_letter("analyze", str(err), original=record.value, spec_id=spec_id,
                                                     source=SourceRef(record.topic, record.partition, record.offset)))
                continue
            groups.setdefault((spec_id, crowd, end), []).append(row)
        for (spec_id, crowd, end), rows in groups.items():
            batch = ShuffledBatch(spec_id, crowd, end, rows_to_array(self._specs[spec_id].randomizer, rows))
            yield window.TimestampedValue(batch, Timestamp(micros=end * 1000 - 1))
