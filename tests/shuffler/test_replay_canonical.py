"""Replay detection is canonical: a set re-encoded in non-canonical Avro (overlong varints, split array blocks,
a 2^64-wider time) decodes to the same signed fields, and the shuffler counts it once, whatever its bytes.

Issue 26, finding 2: replay detection hashed the record bytes while the device signs field values, so with
``max_reports_per_window`` > 1 two re-encodings of each honest set tripled the crowd (n_clients 166 -> 498) and
understated every stderr by sqrt(3). The dedupe digest now covers what was signed.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings

from tests.transforms.reencode import Layout, layouts
from tests.transforms.release_inputs import (
    WIN_A,
    Devices,
    decode_set,
    ingress_fn,
    make_spec,
    shuffle_run,
    split_outputs,
)
from transforms.trust.message_set import decode_message_set, encode_message_set

QUOTA = 3
SPEC = make_spec(quota=QUOTA, min_clients=2)


@pytest.fixture(scope="module")
def devices(tmp_path_factory: pytest.TempPathFactory) -> Devices:
    return Devices.enrol(tmp_path_factory.mktemp("replay") / "keys", 24)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=layouts)
def test_every_reencoding_that_decodes_is_admitted_under_the_original_digest(devices: Devices, layout: Layout
                                                                             ) -> None:
    honest = devices.message_set(SPEC, "c0", WIN_A + 17, [(3,)])
    ms = decode_set(honest)
    again = layout.write(ms)
    try:
        decoded = decode_message_set(again)
    except ValueError:
        assume(False)  # a layout the decoders refuse is no replay (it is dead-lettered as malformed)
    assert decoded == ms
    fn = ingress_fn([SPEC], devices)
    records = [devices.record(honest, partition=3), devices.record(devices.envelope(again), partition=3)]
    main, tagged = split_outputs(fn.process(records))
    assert not tagged.get("dead_letters")
    items = [item for _, blob in main for item in pickle.loads(blob)]
    assert len(items) == 2 and items[0].digest == items[1].digest


def test_the_decoders_accept_the_reencodings_an_attacker_would_use(devices: Devices) -> None:
    """The attack is real: overlong varints everywhere, sized blocks and a wide time all decode to the set."""
    ms = decode_set(devices.message_set(SPEC, "c1", WIN_A + 5, [(2,)]))
    for layout in (Layout((1,), (), False, False), Layout((0, 2, 1), (), True, False),
                   Layout((0,), (), False, True)):
        again = layout.write(ms)
        assert again != encode_message_set(ms) and decode_message_set(again) == ms
    assert Layout((0,), (), False, False).write(ms) == encode_message_set(ms)  # the writer is Avro's


def test_reencoded_replays_count_once_toward_the_crowd(devices: Devices, tmp_path: Path) -> None:
    """20 devices, each its honest set plus two re-encodings, quota 3: 20 sets, not 60; the copies are counted
    as duplicates (no dead letter: a resend is not an attack on anyone)."""
    clients = devices.clients[:20]
    records = []
    for i, client in enumerate(clients):
        honest = devices.message_set(SPEC, client, WIN_A + 100 * i, [(i % SPEC.d,)])
        ms = decode_set(honest)
        records.append(devices.record(honest))
        for layout in (Layout((1, 0), (), False, False), Layout((0,), (), False, True)):
            records.append(devices.record(devices.envelope(layout.write(ms))))
    run = shuffle_run(tmp_path, [SPEC], devices, records)
    assert run.count("sets_authenticated") == 60
    assert run.count("distinct_devices") == 20
    assert run.count("sets_valid") == 20 and run.count("sets_duplicate") == 40
    assert run.count("dead_lettered") == 0
    released = sum(p.n_sets for p in run.values("released"))
    assert released + run.count("sets_deleted") == 20
