"""Ingress judges a batch in passes (stage every record, look every device up at once, verify on the pool):
a record's verdict must not depend on the batch it arrives in, nor on how its devices were looked up.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from tests.shuffler.test_ingress import CROWDED, RAPPOR, SPEC, refusals
from tests.transforms.release_inputs import (
    TIMES_POLICY,
    TOPIC,
    WIN_A,
    Devices,
    ingress_fn,
    make_spec,
    split_outputs,
)
from transforms.io.kafka.bounded import KafkaRecord
from transforms.shuffler.elements import DEAD, VERIFIED, TimePolicy
from transforms.shuffler.ingress import IngressFn
from transforms.state.prior_runs import PriorRuns
from transforms.state.verified_sets import VerifiedSets

SPECS = [SPEC, CROWDED, RAPPOR]


@pytest.fixture(scope="module")
def devices(tmp_path_factory: pytest.TempPathFactory) -> Devices:
    return Devices.enrol(tmp_path_factory.mktemp("ingress_batch") / "keys", 6)


def mixed_records(devices: Devices) -> list[KafkaRecord]:
    """Every refusal, good sets of three specs, and byte-identical copies of a good set, on two partitions."""
    good = [devices.message_set(SPEC, f"c{i}", WIN_A + i, [(i % 8,)]) for i in range(6)]
    good += [devices.message_set(CROWDED, "c1", WIN_A + 3, [(2,)], crowd="v1"),
             devices.message_set(RAPPOR, "c2", WIN_A + 4, [(-1,), (3,)])]
    values = [v for v, _ in refusals(devices).values()] + good + [good[0], good[0]]
    values = [values[(11 * i) % len(values)] for i in range(len(values))]  # interleaved (11: coprime to 28)
    return [devices.record(v, partition=i % 2) for i, v in enumerate(values)]


def verdicts(fn: IngressFn, batches: list[list[KafkaRecord]]) -> dict[tuple[int, int], Any]:
    """(partition, offset) -> the dead letter's reason, or the admitted set."""
    out: dict[tuple[int, int], Any] = {}
    for batch in batches:
        main, tagged = split_outputs(fn.process(batch))
        for letter in tagged.get(DEAD, []):
            out[letter["partition"], letter["offset"]] = letter["reason"]
        for _, blob in main:
            for item in pickle.loads(blob):
                out[item.source.partition, item.source.offset] = item
    return out


def verified_cache(fn: IngressFn, records: list[KafkaRecord]) -> VerifiedSets:
    _, tagged = split_outputs(fn.process(records))
    return VerifiedSets().merged([(p, o, np.frombuffer(d, dtype=np.uint8)) for p, o, d in tagged[VERIFIED]], {})


def test_a_records_verdict_does_not_depend_on_its_batch(devices: Devices) -> None:
    records = mixed_records(devices)
    whole = verdicts(ingress_fn(SPECS, devices), [records])
    alone = verdicts(ingress_fn(SPECS, devices), [[r] for r in records])
    assert whole == alone and len(whole) == len(records)
    reasons = [v for v in whole.values() if isinstance(v, str)]
    assert len(reasons) == len(refusals(devices))  # one dead letter per refusal
    assert sum(not isinstance(v, str) for v in whole.values()) == 10


def test_sets_verified_before_are_still_looked_up_in_a_batch(devices: Devices) -> None:
    """A re-read batch: the sets verified by the first run skip their signature, not their registry lookup."""
    from transforms.trust.devices import DeviceRegistry

    records = mixed_records(devices)
    cache = verified_cache(ingress_fn(SPECS, devices), records)
    again = ingress_fn(SPECS, devices, PriorRuns(verified=cache))
    first = verdicts(ingress_fn(SPECS, devices), [records])
    assert verdicts(again, [records]) == first
    _, tagged = split_outputs(again.process(records))
    assert VERIFIED not in tagged  # nothing verified twice
    # The same records once c4 and c5 have left the registry: their sets are refused, nothing else changes.
    again._registry = DeviceRegistry()
    devices.fleet.enroll(again._registry, devices.clients[:4])
    gone = {devices.device_id(c) for c in devices.clients[4:]}
    expected = {k: "unauthenticated: unknown device (not enrolled)" if getattr(v, "device_id", None) in gone else v
                for k, v in first.items()}
    assert verdicts(again, [records]) == expected != first


@dataclass
class FailingBatches:
    """A registry whose batch lookup breaks (a bug): ingress must fall back to one id at a time."""

    registry: Any

    def public_keys(self, device_ids: list[str]) -> list[bytes | None]:
        raise RuntimeError("batch lookup broken")

    def public_key(self, device_id: str) -> bytes | None:
        return self.registry.public_key(device_id)


def test_a_failing_batch_lookup_falls_back_to_one_id_at_a_time(devices: Devices) -> None:
    records = mixed_records(devices)
    expected = verdicts(ingress_fn(SPECS, devices), [records])
    fn = ingress_fn(SPECS, devices)
    fn._registry = FailingBatches(fn._registry)
    assert verdicts(fn, [records]) == expected


@dataclass(frozen=True)
class BrokenClock(TimePolicy):
    """A time policy that raises on one event time: a bug that must cost that record only."""

    broken_ms: int = 0

    def problem(self, event_time_ms: int, now_ms: int | None = None) -> str | None:
        if event_time_ms == self.broken_ms:
            raise KeyError("bug")
        return super().problem(event_time_ms, now_ms)


def test_an_exception_on_one_record_is_that_records_dead_letter_only(devices: Devices) -> None:
    spec = make_spec()
    records = [devices.record(devices.message_set(spec, f"c{i}", WIN_A + i, [(1,)]), partition=5) for i in range(4)]
    times = BrokenClock(TIMES_POLICY.now_ms, TIMES_POLICY.max_age_ms, TIMES_POLICY.max_skew_ms, WIN_A + 2)
    got = verdicts(ingress_fn([spec], devices, times=times), [records])
    assert got[5, records[2].offset] == "internal error on this record (KeyError)"
    assert all(not isinstance(got[5, r.offset], str) for r in records if r is not records[2])


@dataclass(frozen=True)
class AskedClock(TimePolicy):
    """``TimePolicy`` itself as a subclass: ingress asks it about every set (its in-range shortcut is for the
    plain class only)."""


def test_the_in_range_shortcut_judges_event_times_as_the_time_policy(devices: Devices) -> None:
    spec = make_spec()
    now, age, skew = TIMES_POLICY.now_ms, TIMES_POLICY.max_age_ms, TIMES_POLICY.max_skew_ms
    times = [now - age - 1, now - age, now - age + 1, now + skew - 1, now + skew, now + skew + 1]
    records = [devices.record(devices.message_set(spec, f"c{i}", t, [(1,)]), partition=3)
               for i, t in enumerate(times)]
    shortcut = verdicts(ingress_fn([spec], devices), [records])
    assert shortcut == verdicts(ingress_fn([spec], devices, times=AskedClock(now, age, skew)), [records])
    assert [type(shortcut[3, r.offset]) is str for r in records] == [True, False, False, False, False, True]
    later = PriorRuns(read_clock={f"{TOPIC}/3": ((records[-1].offset + 1, now + 10 * skew),)})  # first read then
    judged = verdicts(ingress_fn([spec], devices, prior=later), [records])
    assert judged == verdicts(ingress_fn([spec], devices, prior=later, times=AskedClock(now, age, skew)), [records])
    assert [type(judged[3, r.offset]) is str for r in records] == [True, True, True, False, False, False]
