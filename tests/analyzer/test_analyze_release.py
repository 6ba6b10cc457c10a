"""Analyzer ingress (transforms/analyzer/releases.py): only whole, signed, consistent releases are opened.

Releases are built as the shuffler's driver builds them (sealed messages of enrolled devices, numbered and
signed batches, tests/transforms/release_inputs.py) and fed to ``DecodeReleaseFn``, ``OpenBatchFn`` and
``AssembleReleaseFn`` directly, chained as the analyze job chains them. Dead letters on the analyst's side never
carry the record's bytes.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.transforms.release_inputs import (
    WIN_A,
    WINDOW_MS,
    Devices,
    make_spec,
    open_and_assemble,
    sign_release,
    split_outputs,
)
from transforms.analyzer.estimates import estimate_rows
from transforms.analyzer.releases import DEAD, HELD, AssembleReleaseFn, DecodeReleaseFn, OpenedRelease
from transforms.io.kafka.bounded import KafkaRecord
from transforms.shuffler.graph import ReleasePart
from transforms.state.prior_runs import PriorRuns
from transforms.trust.keys import load_shuffler_signer
from transforms.trust.release import (
    decode_release_batch,
    encode_release_batch,
    release_id_of,
    sign_release_batch,
)

SPEC = make_spec(min_clients=10)
END = WIN_A + WINDOW_MS
N = 30
VALUES = [i % 8 for i in range(N)]


@pytest.fixture(scope="module")
def devices(tmp_path_factory: pytest.TempPathFactory) -> Devices:
    return Devices.enrol(tmp_path_factory.mktemp("analyze") / "keys", 3)


def part(devices: Devices, values: list[int], end: int = END, crowd: str | None = None) -> ReleasePart:
    messages = tuple((m.channel, m.sealed) for v in values
                     for m in devices.sealed_messages(SPEC, [(v,)], crowd, end - 1))
    return ReleasePart(SPEC.spec_id, crowd, end, 0, messages, len(values), None)


@pytest.fixture(scope="module")
def batches(devices: Devices) -> list[bytes]:
    """The release of N sets with values VALUES, in three batches (10 messages each)."""
    (release,) = sign_release(devices.keys_dir, [part(devices, VALUES)], per_batch=10).values()
    assert len(release) == 3
    return release


OFFSETS = itertools.count()


def records(values: list[bytes], partition: int = 0) -> list[KafkaRecord]:
    return [KafkaRecord("shuffled", partition, next(OFFSETS), 0, None, v) for v in values]


def decode(devices: Devices, values: list[bytes], prior: PriorRuns | None = None, verifiers: dict | None = None
           ) -> tuple[list, dict[str, list]]:
    fn = DecodeReleaseFn([SPEC], str(devices.keys_dir), prior or PriorRuns())
    fn.setup()
    if verifiers:  # a second shuffler's key the analyzer also trusts (its public file, as after a rotation)
        fn._verifiers = {**fn._verifiers, **verifiers}
    return split_outputs(fn.process(records(values)))


def assemble(devices: Devices, values: list[bytes]) -> tuple[list, dict[str, list]]:
    main, tagged = decode(devices, values)
    assert DEAD not in tagged, tagged[DEAD]
    return open_and_assemble([SPEC], devices.keys_dir, main)


def resign(devices: Devices, value: bytes, **changes: object) -> bytes:
    key_id, signer = load_shuffler_signer(devices.keys_dir)
    return encode_release_batch(sign_release_batch(replace(decode_release_batch(value), **changes), key_id, signer))


def test_a_whole_release_opens_into_its_counts(devices: Devices, batches: list[bytes]) -> None:
    main, tagged = assemble(devices, [batches[2], batches[0], batches[1], batches[0]])  # order, a duplicate
    assert tagged == {}
    (opened,) = main
    assert isinstance(opened, OpenedRelease) and opened.release_id == release_id_of(SPEC.spec_id, None, END)
    assert (opened.n_sets, opened.accumulator.n, opened.accumulator.messages) == (N, N, N)
    rows = estimate_rows(SPEC, None, opened.accumulator, END - WINDOW_MS, END)
    assert [r["n_clients"] for r in rows] == [N] * SPEC.d and rows[0]["n_deleted"] is None
    # GRR's unbiased estimator: sum of estimates is exactly 1 whatever the reports.
    assert sum(r["raw_estimate"] for r in rows) == pytest.approx(1.0, abs=1e-9)


def test_assembly_takes_only_opened_batches(devices: Devices, batches: list[bytes]) -> None:
    # Unopened batches (sealed messages) must not reach the GroupByKey: the analyze job opens them first.
    ((release_id, element),), _ = decode(devices, batches[:1])
    with pytest.raises(TypeError, match=r"OpenBatchFn.*got BatchElement"):
        list(AssembleReleaseFn([SPEC]).process((release_id, [element])))


def test_forged_unsigned_and_tampered_batches_are_refused(devices: Devices, batches: list[bytes]) -> None:
    batch = decode_release_batch(batches[0])
    forger = Ed25519PrivateKey.generate()
    cases = {
        "unsigned": encode_release_batch(replace(batch, signature=bytes(64))),
        "forged": encode_release_batch(sign_release_batch(batch, batch.key_id, forger)),
        "unknown key": encode_release_batch(sign_release_batch(batch, "k-unknown", forger)),
        "tampered": encode_release_batch(replace(batch, n_sets=N + 1)),
        "garbage": b"\x00\x01garbage",
        "truncated": batches[0][:-5],
    }
    main, tagged = decode(devices, list(cases.values()))
    assert main == [] and len(tagged[DEAD]) == len(cases)
    reasons = [d["reason"] for d in tagged[DEAD]]
    assert all("unauthenticated release batch" in r for r in reasons[:4]), reasons
    assert all("malformed release batch" in r for r in reasons[4:]), reasons
    assert all(d["original"] is None and d["stage"] == "analyze" for d in tagged[DEAD])


def test_routing_that_does_not_fit_the_spec_is_refused(devices: Devices, batches: list[bytes]) -> None:
    other_spec = make_spec(name="not_served")
    unaligned = END + 1
    cases = {
        "unknown spec": (resign(devices, batches[0], spec_id=other_spec.spec_id,
                                release_id=release_id_of(other_spec.spec_id, None, END)), "does not serve"),
        "unaligned window": (resign(devices, batches[0], window_end_ms=unaligned,
                                    release_id=release_id_of(SPEC.spec_id, None, unaligned)), "not the end of"),
        "crowd": (resign(devices, batches[0], crowd_id="v1", release_id=release_id_of(SPEC.spec_id, "v1", END)),
                  "crowd_id does not fit"),
    }
    main, tagged = decode(devices, [v for v, _ in cases.values()])
    assert main == []
    for letter, (name, (_, reason)) in zip(tagged[DEAD], cases.items(), strict=True):
        assert reason in letter["reason"], name
    # A release id that does not match its routing cannot even be encoded, let alone decoded.
    with pytest.raises(ValueError, match="release_id does not match"):
        resign(devices, batches[0], release_id=release_id_of(SPEC.spec_id, None, END + WINDOW_MS))


def test_a_partial_release_is_held_at_its_earliest_batch(devices: Devices, batches: list[bytes]) -> None:
    main, tagged = assemble(devices, [batches[0], batches[2]])
    assert main == [] and DEAD not in tagged
    ((pkey, offset),) = tagged[HELD]
    assert pkey == "shuffled/0" and offset == next(OFFSETS) - 2  # the offset of batches[0]


def test_inconsistent_batches_refuse_the_release(devices: Devices, batches: list[bytes]) -> None:
    # A batch index twice, under one header and key, with different contents: no release to trust.
    odd = resign(devices, batches[2], messages=decode_release_batch(batches[1]).messages)
    main, tagged = assemble(devices, [batches[0], batches[1], batches[2], odd])
    assert main == [] and len(tagged[DEAD]) == 4
    assert all("inconsistent release" in d["reason"] for d in tagged[DEAD])
    # A batch under another header is another release of this window: while the first is incomplete, all wait.
    main, tagged = assemble(devices, [batches[0], batches[1], resign(devices, batches[2], n_sets=N - 1)])
    assert main == [] and DEAD not in tagged and {pkey for pkey, _ in tagged[HELD]} == {"shuffled/0"}
    # Every batch present and consistent, but the header claims one message more than they hold.
    short = [resign(devices, b, n_messages=N + 1) for b in batches]
    main, tagged = assemble(devices, short)
    assert main == [] and all("fewer messages than its header" in d["reason"] for d in tagged[DEAD])


def test_two_valid_releases_of_a_window_keep_the_first_and_report_the_second(devices: Devices,
                                                                             batches: list[bytes]) -> None:
    """Issue 26, finding 5: a second shuffler (other state; or other keys the analyzer also trusts) publishes
    its own valid release of the window. Refusing both lost the window; the first published is taken, the
    other is dead-lettered as a conflict, whichever order the batches are grouped in."""
    other_key_id, other = "20991231-0f0f0f0f", Ed25519PrivateKey.generate()
    second = [encode_release_batch(sign_release_batch(replace(decode_release_batch(b), n_sets=N - 3), other_key_id,
                                                      other)) for b in batches]
    for first, later in ((batches, second), (second, batches)):
        main, tagged = decode(devices, first + later[:2] + later[2:], verifiers={other_key_id: other.public_key()})
        assert DEAD not in tagged
        (opened,), tagged = open_and_assemble([SPEC], devices.keys_dir, list(reversed(main)))
        assert opened.n_sets == (N if first is batches else N - 3)
        assert len(tagged[DEAD]) == 3 and all("conflicting release" in d["reason"] for d in tagged[DEAD])
        assert sorted(d["offset"] for d in tagged[DEAD]) == sorted(e.source.offset for _, e in main[3:])


def test_a_release_below_the_minimum_crowd_is_refused(devices: Devices) -> None:
    (small,) = sign_release(devices.keys_dir, [part(devices, VALUES[:9])]).values()
    main, tagged = assemble(devices, small)
    assert main == [] and "below the spec's minimum crowd (10)" in tagged[DEAD][0]["reason"]


def test_a_replayed_release_is_dead_lettered_and_re_reads_are_skipped(devices: Devices, batches: list[bytes]
                                                                      ) -> None:
    start = next(OFFSETS) + 1
    prior = PriorRuns(released={(SPEC.spec_id, None, END): {"shuffled/0": start + 2}})
    main, tagged = decode(devices, batches, prior)  # offsets start, start+1 (analyzed before), start+2 (replay)
    assert main == []
    ((letter),) = tagged[DEAD]
    assert letter["offset"] == start + 2 and "replayed release" in letter["reason"]


def test_undecodable_messages_are_dead_lettered_one_by_one(devices: Devices) -> None:
    good = part(devices, VALUES)
    wrong_window = part(devices, [3], end=END + WINDOW_MS).messages  # sealed for another window's AD
    messages = (*good.messages[:-2], (0, b"\x01" * 40), *wrong_window)
    (release,) = sign_release(devices.keys_dir, [good._replace(messages=messages)]).values()
    main, tagged = assemble(devices, release)
    (opened,) = main
    assert opened.accumulator.messages == N - 2
    assert len(tagged[DEAD]) == 2 and all("unusable message" in d["reason"] for d in tagged[DEAD])


# --- property: arbitrary bytes never raise; every record has exactly one fate -----------------------------------

@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_decode_release_never_raises_and_gives_every_record_one_fate(data: st.DataObject, devices: Devices,
                                                                      batches: list[bytes]) -> None:
    def flip(value: bytes, position: int, mask: int) -> bytes:
        i = position % len(value)
        return value[:i] + bytes([value[i] ^ mask]) + value[i + 1:]

    value = st.one_of(st.binary(max_size=300), st.sampled_from(batches),
                      st.builds(flip, st.sampled_from(batches), st.integers(0, 10_000), st.integers(1, 255)),
                      st.builds(lambda v, n: v[:n], st.sampled_from(batches), st.integers(0, 2000)))
    values = data.draw(st.lists(value, min_size=1, max_size=6))
    skipped_below = data.draw(st.integers(0, len(values)))
    fn = DecodeReleaseFn([SPEC], str(devices.keys_dir), PriorRuns(processed_until={"shuffled/4": skipped_below}))
    fn.setup()
    main, tagged = split_outputs(fn.process([KafkaRecord("shuffled", 4, i, 0, None, v)
                                             for i, v in enumerate(values)]))
    admitted = [e.source.offset for _, e in main]
    dead = [d["offset"] for d in tagged.get(DEAD, [])]
    assert sorted(admitted + dead) == sorted(set(admitted + dead))
    assert all(o >= skipped_below for o in dead)
    assert all(o < skipped_below for o in set(range(len(values))) - set(admitted) - set(dead))
    assert {b.batch.release_id for _, b in main} <= {release_id_of(SPEC.spec_id, None, END)}


def test_a_batch_of_a_key_not_distributed_yet_is_held_until_the_wait_ends(devices: Devices,
                                                                          batches: list[bytes]) -> None:
    """A rotation's new key id (dated no earlier than the analyzer's newest) is held while the record is younger
    than the wait; an older unknown id, or one past the wait, is dead-lettered (issue 26, finding 4)."""
    from transforms.analyzer.releases import KEY_WAIT_MS

    now = 1_900_000_000_000
    signer = Ed25519PrivateKey.generate()
    batch = decode_release_batch(batches[0])
    rotated = encode_release_batch(sign_release_batch(batch, "20991231-0a0b0c0d", signer))
    forged_old = encode_release_batch(sign_release_batch(batch, "20200101-0a0b0c0d", signer))
    fn = DecodeReleaseFn([SPEC], str(devices.keys_dir), PriorRuns(), now_ms=now)
    fn.setup()
    fresh = [KafkaRecord("shuffled", 0, 1, now - 60_000, None, rotated),
             KafkaRecord("shuffled", 0, 2, now - KEY_WAIT_MS - 1, None, rotated),
             KafkaRecord("shuffled", 0, 3, now - 60_000, None, forged_old)]
    main, tagged = split_outputs(fn.process(fresh))
    assert main == [] and tagged[HELD] == [("shuffled/0", 1)]
    reasons = {d["offset"]: d["reason"] for d in tagged[DEAD]}
    assert "not distributed within 86400 s" in reasons[2]
    assert reasons[3] == "unauthenticated release batch: unknown shuffler key id"


class _Tally:
    """Stands in for a Beam counter outside a pipeline (process() is called directly here)."""

    def __init__(self) -> None:
        self.n = 0

    def inc(self, n: int = 1) -> None:
        self.n += n


def test_a_conflicting_release_is_set_aside_not_counted_as_dead_lettered(devices: Devices,
                                                                         batches: list[bytes]) -> None:
    """Issue 34, L3': a one-shot analyzer that set aside a second shuffler's release exited 6 (too many dead
    letters) although the window was analyzed from the first: the set-aside batches keep their dead letters
    (with the reason) but count apart, so the dead-letter bar does not see them."""
    from transforms.analyzer.releases import OpenBatchFn

    other_key_id, other = "20991231-0f0f0f0f", Ed25519PrivateKey.generate()
    second = [encode_release_batch(sign_release_batch(replace(decode_release_batch(b), n_sets=N - 3), other_key_id,
                                                      other)) for b in batches]
    main, _ = decode(devices, batches + second, verifiers={other_key_id: other.public_key()})
    opener, assembler = OpenBatchFn([SPEC], str(devices.keys_dir)), AssembleReleaseFn([SPEC])
    opener.setup()
    dead, set_aside = _Tally(), _Tally()
    assembler._dead, assembler._set_aside = dead, set_aside
    groups: dict[str, list] = {}
    for element in main:
        for release_id, opened in opener.process(element):
            groups.setdefault(release_id, []).append(opened)
    outputs = [out for group in groups.items() for out in assembler.process(group)]
    letters = [o.value for o in outputs if getattr(o, "tag", None) == DEAD]
    assert len(letters) == 3 and all("conflicting release" in d["reason"] for d in letters)
    assert (set_aside.n, dead.n) == (3, 0)
