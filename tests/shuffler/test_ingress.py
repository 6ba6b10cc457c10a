"""Shuffler ingress (transforms/shuffler/ingress.py): what it refuses, and that no byte string can make it raise.

Every refusal is a dead letter whose reason names no device; only authenticated, in-range sets move the
watermark. The property tests feed arbitrary bytes and mutations of valid sets: every record ends as
exactly one of a set, a dead letter or a skip (a record a previous run already handled).
"""

from __future__ import annotations

import pickle
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.transforms.release_inputs import (
    NOW_MS,
    TIMES_POLICY,
    TOPIC,
    WIN_A,
    WINDOW_MS,
    Devices,
    ingress_fn,
    make_spec,
    split_outputs,
)
from transforms.io.kafka.bounded import KafkaRecord
from transforms.shuffler.elements import DEAD, TIMES, VERIFIED
from transforms.shuffler.ingress import IngressFn
from transforms.state.prior_runs import PriorRuns
from transforms.trust.message_set import SealedMessage, decode_message_set, encode_message_set, sign_message_set
from transforms.trust.sealing import associated_data, seal
from transforms.wire.avro_payload import encode_payload
from transforms.wire.rows import PRESENCE

SPEC = make_spec()
CROWDED = make_spec(partition="app_version", name="crowded")
RAPPOR = make_spec("rappor", size=6, name="frag_ingress")
DAY_MS = 86_400_000


@pytest.fixture(scope="module")
def devices(tmp_path_factory: pytest.TempPathFactory) -> Devices:
    return Devices.enrol(tmp_path_factory.mktemp("ingress") / "keys", 5)


@pytest.fixture(scope="module")
def ingress(devices: Devices) -> IngressFn:
    return ingress_fn([SPEC, CROWDED, RAPPOR], devices)


def altered(devices: Devices, value: bytes, **changes: object) -> bytes:
    """The set with fields changed after the device signed it (the signature no longer covers them)."""
    return devices.envelope(encode_message_set(replace(decode_message_set(devices.peel(value)), **changes)))


def refusals(devices: Devices) -> dict[str, tuple[bytes | None, str]]:
    good = devices.message_set(SPEC, "c0", WIN_A + 5, [(1,)])
    ms = decode_message_set(devices.peel(good))
    flipped = bytes([ms.signature[0] ^ 1]) + ms.signature[1:]
    return {
        "empty": (None, "empty record"),
        "malformed": (devices.envelope(b"\xc3\x01not a message set"), "malformed message set"),
        "truncated": (devices.envelope(devices.peel(good)[:-10]), "malformed message set"),
        "bare set, not sealed to the shuffler": (devices.peel(good), "not sealed to the shuffler"),
        "truncated envelope": (good[:-10], "not sealed to the shuffler: authentication failed"),
        "garbage": (b"\xc3\x01not a message set", "not sealed to the shuffler"),
        "unknown spec": (devices.message_set(SPEC, "c0", WIN_A, [(1,)], spec_id="other@000000000000"),
                         "unknown spec_id"),
        "crowd for an unpartitioned spec": (devices.message_set(SPEC, "c0", WIN_A, [(1,)], crowd="v1"),
                                            "has no crowd partition"),
        "no crowd for a partitioned spec": (devices.message_set(CROWDED, "c0", WIN_A, [(1,)]), "no crowd_id"),
        "stale": (devices.message_set(SPEC, "c0", NOW_MS - 31 * DAY_MS, [(1,)]), "stale"),
        "future": (devices.message_set(SPEC, "c0", NOW_MS + 3_600_001, [(1,)]), "from the future"),
        "bad signature": (altered(devices, good, signature=flipped), "unauthenticated: bad signature"),
        "tampered time": (altered(devices, good, event_time_ms=ms.event_time_ms + 1), "unauthenticated"),
        "tampered device": (altered(devices, good, device_id=devices.device_id("c1")), "unauthenticated"),
        # The fleet derives a key for any client id; "stranger" was never enrolled.
        "unenrolled": (devices.message_set(SPEC, "stranger", WIN_A, [(1,)]), "unknown device"),
        "grr on channel 1": (devices.message_set(SPEC, "c0", WIN_A, [(1,)], channels=[1]),
                             "exactly one message on channel 0"),
        "grr with two messages": (devices.message_set(SPEC, "c0", WIN_A, [(1,), (2,)]), "exactly one message"),
        "rappor channel 6": (devices.message_set(RAPPOR, "c0", WIN_A, [(PRESENCE,), (6,)]),
                             "channel 6 does not exist"),
    }


def test_each_refusal_is_one_dead_letter_with_a_reason_naming_no_device(devices: Devices, ingress: IngressFn
                                                                        ) -> None:
    cases = refusals(devices)
    good = devices.record(devices.message_set(SPEC, "c3", WIN_A + 77, [(2,)]))
    records = [devices.record(value, partition=1) for value, _ in cases.values()]
    main, tagged = split_outputs(ingress.process([*records, good]))
    letters = {d["offset"]: d for d in tagged[DEAD]}
    assert len(tagged[DEAD]) == len(cases)
    secrets = {devices.device_id(c) for c in [*devices.clients, "stranger"]} | {*devices.clients, "stranger"}
    for record, (name, (_, reason)) in zip(records, cases.items(), strict=True):
        letter = letters[record.offset]
        assert reason in letter["reason"], (name, letter["reason"])
        assert letter["stage"] == "ingress" and letter["original"] == (record.value or None)
        assert not any(s in letter["reason"] for s in secrets), name
    # Only the authenticated set was admitted, and only it moved partition 0's event time.
    ((key, blob),) = main
    (item,) = pickle.loads(blob)
    assert key[:3] == (SPEC.spec_id, None, WIN_A + WINDOW_MS) and item.source.offset == good.offset
    assert dict(tagged[TIMES]) == {"reports/0": WIN_A + 77}


def test_crowd_ids_key_the_sets_of_a_partitioned_spec(devices: Devices, ingress: IngressFn) -> None:
    records = [devices.record(devices.message_set(CROWDED, c, WIN_A + 9, [(1,)], crowd=crowd), partition=2)
               for c, crowd in (("c0", "v1"), ("c1", "v2"), ("c2", "v1"))]
    main, tagged = split_outputs(ingress.process(records))
    assert DEAD not in tagged
    crowds = sorted(item.crowd_id for key, blob in main for item in pickle.loads(blob) if key[1] == item.crowd_id)
    assert crowds == ["v1", "v1", "v2"]


# --- property: arbitrary bytes never raise; every record has exactly one fate -----------------------------------

def outcome_offsets(outputs: list) -> tuple[list[int], list[int]]:
    main, tagged = split_outputs(outputs)
    admitted = [item.source.offset for _, blob in main for item in pickle.loads(blob)]
    return admitted, [d["offset"] for d in tagged.get(DEAD, [])]


@pytest.fixture(scope="module")
def valid_values(devices: Devices) -> list[bytes]:
    return [devices.message_set(SPEC, c, WIN_A + i, [(i % 8,)]) for i, c in enumerate(devices.clients)]


def mutated(values: list[bytes]) -> st.SearchStrategy[bytes]:
    def flip(value: bytes, position: int, mask: int) -> bytes:
        i = position % len(value)
        return value[:i] + bytes([value[i] ^ mask]) + value[i + 1:]

    return st.one_of(
        st.binary(max_size=300),
        st.sampled_from(values),
        st.builds(flip, st.sampled_from(values), st.integers(0, 10_000), st.integers(1, 255)),
        st.builds(lambda v, n: v[:n], st.sampled_from(values), st.integers(0, 400)),
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_ingress_never_raises_and_gives_every_record_one_fate(data: st.DataObject, devices: Devices,
                                                               valid_values: list[bytes]) -> None:
    values = data.draw(st.lists(mutated(valid_values), min_size=1, max_size=8))
    skipped_below = data.draw(st.integers(0, len(values)))
    records = [KafkaRecord("reports", 9, i, NOW_MS, None, v) for i, v in enumerate(values)]
    ingress = ingress_fn([SPEC, CROWDED, RAPPOR], devices, PriorRuns(processed_until={"reports/9": skipped_below}))
    admitted, dead = outcome_offsets(list(ingress.process(records)))
    assert len(set(admitted)) == len(admitted) and len(set(dead)) == len(dead)
    assert not set(admitted) & set(dead)
    assert all(o >= skipped_below for o in dead)  # below processed_until a refusal is a skip
    unhandled = set(range(len(records))) - set(admitted) - set(dead)
    assert all(o < skipped_below for o in unhandled)


def test_mutations_of_a_signed_set_are_never_admitted_as_another_set(devices: Devices, ingress: IngressFn,
                                                                     valid_values: list[bytes]) -> None:
    value = valid_values[0]
    admitted_values = set()
    for i in range(0, len(value), 3):
        candidate = value[:i] + bytes([value[i] ^ 0x40]) + value[i + 1:]
        admitted, _ = outcome_offsets(list(ingress.process([devices.record(candidate, partition=7)])))
        if admitted:
            admitted_values.add(decode_message_set(devices.peel(candidate)))
    # A flipped byte the decoder normalizes away can only give back the very set that was signed.
    assert all(ms == decode_message_set(devices.peel(value)) for ms in admitted_values)


def test_ingress_of_an_empty_batch_emits_nothing(ingress: IngressFn) -> None:
    assert list(ingress.process([])) == []



def test_a_held_set_is_judged_by_the_clock_of_its_first_read(devices: Devices) -> None:
    """A set held in an open window is read again by later runs; it must not turn stale and vanish while it
    waits (it would be counted as re-read and never dead-lettered). New records use the run's own clock."""
    old_set = devices.message_set(SPEC, "c0", WIN_A + 5, [(1,)])
    later = replace(TIMES_POLICY, now_ms=WIN_A + 40 * DAY_MS)  # 40 days on: WIN_A is past max_age (30 days)
    prior = PriorRuns(processed_until={f"{TOPIC}/0": 10}, read_clock={f"{TOPIC}/0": ((10, NOW_MS),)})
    fn = ingress_fn([SPEC], devices, prior, later)
    held, tagged = split_outputs(fn.process([KafkaRecord(TOPIC, 0, 3, 0, None, old_set)]))
    assert len(held) == 1 and not tagged.get(DEAD)
    fresh, tagged = split_outputs(fn.process([KafkaRecord(TOPIC, 0, 12, 0, None, old_set)]))
    assert not fresh and "stale" in tagged[DEAD][0]["reason"]


def test_only_first_reads_move_the_event_time_of_a_partition(devices: Devices) -> None:
    """A held set re-read by a later run is admitted again but emits no event time: otherwise every run would
    mark its partition as having fresh data and the last window of a quiet stream would never go idle."""
    prior = PriorRuns(processed_until={f"{TOPIC}/0": 10}, read_clock={f"{TOPIC}/0": ((10, NOW_MS),)})
    fn = ingress_fn([SPEC], devices, prior)
    reread = KafkaRecord(TOPIC, 0, 3, 0, None, devices.message_set(SPEC, "c0", WIN_A + 5, [(1,)]))
    held, tagged = split_outputs(fn.process([reread]))
    assert len(held) == 1 and not tagged.get(TIMES)
    new = KafkaRecord(TOPIC, 0, 12, 0, None, devices.message_set(SPEC, "c1", WIN_A + 9, [(1,)]))
    _, tagged = split_outputs(fn.process([reread, new]))
    assert dict(tagged[TIMES]) == {f"{TOPIC}/0": WIN_A + 9}


def test_verification_threads_change_nothing_but_speed(devices: Devices) -> None:
    """A batch mixing every refusal with good sets: the same outputs, in the same order, on 1 or 3 threads."""
    cases = list(refusals(devices).values())
    values = [cases[i % len(cases)][0] if i % 3 else devices.message_set(SPEC, f"c{i % 5}", WIN_A + i, [(i % 4,)])
              for i in range(120)]
    records = [devices.record(v, partition=2) for v in values]

    def outputs(threads: int) -> tuple[list, dict]:
        fn = IngressFn([SPEC, CROWDED, RAPPOR], devices.registry, PriorRuns(), TIMES_POLICY, threads,
                       keys_dir=str(devices.keys_dir))
        fn.setup()
        main, tagged = split_outputs(fn.process(records))
        if VERIFIED in tagged:  # offsets arrive as int64 arrays
            tagged[VERIFIED] = [(pkey, offsets.tolist(), digests) for pkey, offsets, digests in tagged[VERIFIED]]
        return [(key, pickle.loads(blob)) for key, blob in main], tagged

    serial, threaded = outputs(1), outputs(3)
    assert threaded == serial
    assert len(serial[1][DEAD]) == 80 and sum(len(items) for _, items in serial[0]) == 40
    assert any(d["reason"].startswith("not sealed to the shuffler") for d in serial[1][DEAD])


def test_a_set_verified_by_an_earlier_run_is_not_verified_again_but_still_checked(devices: Devices) -> None:
    """Re-reads of held sets skip the signature only for the very bytes verified before at that position."""
    from transforms.state.verified_sets import VerifiedSets
    from transforms.trust.devices import DeviceRegistry

    good = devices.record(devices.message_set(SPEC, "c1", WIN_A + 9, [(3,)]), partition=4)
    fn = ingress_fn([SPEC], devices)
    _, tagged = split_outputs(fn.process([good]))
    ((pkey, offsets, digests),) = tagged[VERIFIED]  # the first run reports what it verified
    cache = VerifiedSets().merged([(pkey, offsets, np.frombuffer(digests, dtype=np.uint8))], keep_from={})
    again = IngressFn([SPEC], devices.registry, PriorRuns(verified=cache), TIMES_POLICY,
                      keys_dir=str(devices.keys_dir))
    again.setup()
    main, tagged = split_outputs(again.process([good]))
    assert len(main) == 1 and not tagged.get(VERIFIED) and not tagged.get(DEAD)
    # Other bytes at the same offset (a topic rewritten under us): verified, and a bad signature is refused.
    forged = good._replace(value=altered(devices, good.value, signature=bytes(64)))
    main, tagged = split_outputs(again.process([forged]))
    assert not main and "bad signature" in tagged[DEAD][0]["reason"]
    # The same bytes, but the device is no longer enrolled: refused without a signature check.
    again._registry = DeviceRegistry()
    main, tagged = split_outputs(again.process([good]))
    assert not main and "unknown device" in tagged[DEAD][0]["reason"]


def test_the_registry_is_loaded_once_per_process_until_its_file_changes(tmp_path: Path) -> None:
    """Several IngressFn instances in one worker share one registry; an enrolment (a new file) is seen."""
    from pipelines.enrolment import enrol_simulated
    from transforms.shuffler.ingress import shared_registry

    fleet = Devices.enrol(tmp_path / "keys", 3)
    first, second = ingress_fn([SPEC], fleet), ingress_fn([SPEC], fleet)
    assert first._registry is second._registry and len(first._registry) == 3
    enrol_simulated(fleet.keys_dir, ["late-comer"])
    again = shared_registry(fleet.registry)
    assert again is not first._registry and len(again) == 4


def test_the_shuffler_sealing_key_rotates_without_loss(tmp_path: Path) -> None:
    """Sets sealed to the old and to the new sealing key both open; a running ingress picks the new key up."""
    from transforms.trust.envelope import seal_envelope
    from transforms.trust.keys import generate_shuffler_sealing_key, load_shuffler_sealing_public

    devices = Devices.enrol(tmp_path / "keys", 2)
    running = ingress_fn([SPEC], devices)
    old = devices.record(devices.message_set(SPEC, "c0", WIN_A + 5, [(1,)]))
    new_id = generate_shuffler_sealing_key(devices.keys_dir)
    key_id, public = load_shuffler_sealing_public(devices.keys_dir)
    assert key_id == new_id
    new = devices.record(seal_envelope(public, key_id, devices.peel(devices.message_set(SPEC, "c1", WIN_A + 6,
                                                                                         [(2,)]))))
    running._sealing_loaded -= 60  # its last look at the keys directory was a minute ago
    for fn in (running, ingress_fn([SPEC], devices)):
        main, tagged = split_outputs(fn.process([old, new]))
        assert not tagged.get(DEAD) and sum(len(pickle.loads(blob)) for _, blob in main) == 2


def test_a_blanket_set_sealed_to_an_unknown_analyzer_key_is_dead_lettered(devices: Devices) -> None:
    """The shuffler seals its dummies to the key ids of the real messages beside them: one set sealed to a
    made-up (well-formed) analyzer key id would stop every release of the spec. It is dead-lettered with the
    reason instead, and the same set sealed to the real key passes; a spec without a blanket does not check."""
    blanket = replace(SPEC, crowd=replace(SPEC.crowd, blanket_dummies=3))
    fn = ingress_fn([blanket, SPEC], devices)
    end = WIN_A + WINDOW_MS
    ad = associated_data(blanket.spec_id, None, end, 0)
    ghost = SealedMessage(0, seal(devices.analyzer_public, "20990101-ghost", encode_payload(blanket.randomizer, (1,)),
                                  ad))
    honest = devices.message_set(blanket, "c1", WIN_A + 9, [(1,)])
    forged = decode_message_set(devices.peel(devices.message_set(blanket, "c2", WIN_A + 9, [(1,)])))
    forged = replace(forged, messages=(ghost,))
    forged_value = devices.envelope(encode_message_set(sign_message_set(forged, devices.fleet.signing_key("c2"))))
    plain = decode_message_set(devices.peel(devices.message_set(SPEC, "c3", WIN_A + 9, [(1,)])))
    plain = replace(plain, messages=(SealedMessage(0, seal(devices.analyzer_public, "20990101-ghost",
                                                            encode_payload(SPEC.randomizer, (1,)),
                                                            associated_data(SPEC.spec_id, None, end, 0))),))
    plain_value = devices.envelope(encode_message_set(sign_message_set(plain, devices.fleet.signing_key("c3"))))
    records = [devices.record(v, partition=2) for v in (honest, forged_value, plain_value)]
    main, tagged = split_outputs(fn.process(records))
    (letter,) = tagged[DEAD]
    assert letter["offset"] == records[1].offset
    assert "sealed to analyzer key id '20990101-ghost', which has no public key at the shuffler" in letter["reason"]
    assert len(main) == 2  # the honest blanket set and the plain spec's set (no blanket: no check)
