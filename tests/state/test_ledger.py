"""The release ledger: one seal per key across racing processes, publication recovery, scale."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path

import pytest

from tests.state.racing import kill_9_when_ready, race
from transforms.state.files import StateError, create_exclusive
from transforms.state.ledger import PUBLISHED, SEALED, ReleaseEntry, ReleaseKey, ReleaseLedger, release_id_for

SPEC = "app_language@0123456789ab"


def entry(key: ReleaseKey, digest: str = "d0", run_key: str = "r0", **extra: object) -> ReleaseEntry:
    return ReleaseEntry(key=key, release_id=f"rel-{key.window_end_ms}-{digest}", digest=digest, n_sets=120,
                        n_messages=360, batches=3, source_ends={"reports/0": 1000, "reports/1": 977},
                        run_key=run_key, sealed_at_ms=1_700_000_000_000, extra=dict(extra))


def test_slugs_are_safe_distinct_and_stable() -> None:
    keys = [ReleaseKey(SPEC, None, 3_600_000), ReleaseKey(SPEC, "_all", 3_600_000), ReleaseKey(SPEC, "", 3_600_000),
            ReleaseKey(SPEC, "a/b", 3_600_000), ReleaseKey(SPEC, "a_b", 3_600_000),
            ReleaseKey(SPEC, "../../etc", 3_600_000), ReleaseKey("x/../y", "v1.2", 7_200_000),
            ReleaseKey(SPEC, "é 🚀", 3_600_000)]
    slugs = [k.slug for k in keys]
    assert len(set(slugs)) == len(slugs)
    for slug in slugs:
        spec_part, name = slug.split("/")
        assert re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]*", spec_part), slug
        assert re.fullmatch(r"-?\d+_[A-Za-z0-9_-][A-Za-z0-9._-]*", name), slug
    assert keys[0].slug.endswith("/3600000__all")
    assert ReleaseKey(SPEC, "v1", 5).slug == ReleaseKey(SPEC, "v1", 5).slug


def test_release_ids_are_deterministic_and_tell_keys_and_contents_apart() -> None:
    key = ReleaseKey(SPEC, "v1", 3_600_000)
    assert release_id_for(key, "d1") == release_id_for(ReleaseKey(SPEC, "v1", 3_600_000), "d1")
    others = {release_id_for(key, "d2"), release_id_for(ReleaseKey(SPEC, None, 3_600_000), "d1"),
              release_id_for(ReleaseKey(SPEC, "v1", 7_200_000), "d1"), release_id_for(key, "d1")}
    assert len(others) == 4 and all(re.fullmatch(r"[0-9a-f]{16}", r) for r in others)


def test_key_validation() -> None:
    with pytest.raises(ValueError, match="window_end_ms"):
        ReleaseKey(SPEC, None, 1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="spec_id"):
        ReleaseKey("", None, 1)


def test_entry_json_round_trip() -> None:
    original = entry(ReleaseKey(SPEC, "v1.2", 3_600_000), note="x")
    assert ReleaseEntry.from_json(original.to_json()) == original
    published = dataclasses.replace(original, status=PUBLISHED, published_at_ms=5)
    assert ReleaseEntry.from_json(published.to_json()) == published


def test_seal_get_publish_cycle(tmp_path: Path) -> None:
    ledger = ReleaseLedger(tmp_path / "releases")
    key = ReleaseKey(SPEC, None, 3_600_000)
    assert ledger.get(key) is None
    first = entry(key, digest="aaa")
    assert ledger.seal(first) == (first, True)
    again, created = ledger.seal(entry(key, digest="bbb", run_key="r1"))
    assert not created and again == first  # the caller sees the stored digest differs from its own
    assert ledger.unpublished() == [first]
    ledger.mark_published(key, now_ms=42)
    ledger.mark_published(key, now_ms=99)  # idempotent: the first publication time stands
    stored = ledger.get(key)
    assert stored is not None and stored.status == PUBLISHED and stored.published_at_ms == 42
    assert ledger.unpublished() == []
    with pytest.raises(StateError, match="never sealed"):
        ledger.mark_published(ReleaseKey(SPEC, None, 1))


def test_entries_released_and_unpublished_order(tmp_path: Path) -> None:
    ledger = ReleaseLedger(tmp_path)
    other = "feature_usage@ffffffffffff"
    keys = [ReleaseKey(SPEC, c, w) for c in (None, "v1", "v2") for w in (7_200_000, 3_600_000)]
    for key in keys:
        ledger.seal(entry(key))
    ledger.seal(entry(ReleaseKey(other, None, 3_600_000)))
    ledger.mark_published(keys[0])
    assert len(list(ledger.entries())) == 7
    assert {e.key for e in ledger.entries(SPEC)} == set(keys)
    released = ledger.released(SPEC)
    assert set(released) == {(k.crowd_id, k.window_end_ms) for k in keys}
    assert released[(None, 7_200_000)].status == PUBLISHED and released[("v1", 3_600_000)].status == SEALED
    assert ledger.released("never@000000000000") == {}
    pending = ledger.unpublished()
    assert len(pending) == 6 and [e.key.window_end_ms for e in pending] == sorted(e.key.window_end_ms for e in pending)


def test_listing_ignores_temporary_files_and_reports_corruption(tmp_path: Path) -> None:
    ledger = ReleaseLedger(tmp_path)
    key = ReleaseKey(SPEC, None, 3_600_000)
    ledger.seal(entry(key))
    spec_dir = ledger.path_of(key).parent
    (spec_dir / f".{ledger.path_of(key).name}.0123.tmp").write_text("{half")  # litter of a killed writer
    assert [e.key for e in ledger.entries()] == [key]
    ledger.path_of(key).write_text("{half")
    with pytest.raises(StateError, match="corrupt state file"):
        list(ledger.entries())


def test_a_slug_collision_is_refused_not_confused(tmp_path: Path) -> None:
    ledger = ReleaseLedger(tmp_path)
    mine, theirs = ReleaseKey(SPEC, "v1", 10), ReleaseKey(SPEC, "v2", 10)
    ledger.path_of(mine).parent.mkdir(parents=True)
    ledger.path_of(mine).write_text(json.dumps(entry(theirs).to_json()))  # forged collision
    with pytest.raises(StateError, match="collision"):
        ledger.get(mine)


def _race_seal(me: int, root: Path) -> tuple[bool, str]:
    stored, created = ReleaseLedger(root).seal(entry(ReleaseKey(SPEC, "v1", 3_600_000), digest=f"d{me}"))
    return created, stored.digest


def test_seal_has_exactly_one_winner_among_8_processes(tmp_path: Path) -> None:
    results = race(8, _race_seal, tmp_path)
    winners = [i for i, (created, _) in enumerate(results) if created]
    assert len(winners) == 1, results
    assert {digest for _, digest in results} == {f"d{winners[0]}"}  # every loser saw the winner's entry
    stored = ReleaseLedger(tmp_path).get(ReleaseKey(SPEC, "v1", 3_600_000))
    assert stored is not None and stored.digest == f"d{winners[0]}"


SEALER = """
    import sys
    from pathlib import Path
    from transforms.state.ledger import ReleaseEntry, ReleaseKey, ReleaseLedger
    ledger = ReleaseLedger(Path(sys.argv[1]))
    for i in range(10**6):
        key = ReleaseKey("s@0123456789ab", f"v{i % 7}", i)
        ledger.seal(ReleaseEntry(key=key, release_id=f"r{i}", digest="d", n_sets=1, n_messages=1, batches=1,
                                 source_ends={}, run_key="k", sealed_at_ms=1, extra={"pad": "x" * 200_000}))
        ledger.mark_published(key)
        if i == 0:
            print("ready", flush=True)
"""


@pytest.mark.parametrize("kill_after_s", [0.02, 0.2])
def test_kill_9_while_sealing_and_publishing_leaves_a_readable_ledger(tmp_path: Path, kill_after_s: float) -> None:
    kill_9_when_ready(SEALER, str(tmp_path), after_s=kill_after_s)
    found = list(ReleaseLedger(tmp_path).entries())  # raises on any partial entry
    assert found and all(e.extra["pad"] == "x" * 200_000 for e in found)
    windows = sorted(e.key.window_end_ms for e in found)
    assert windows == list(range(len(windows)))  # sealed in order, none lost before the kill
    assert all(e.status == PUBLISHED for e in found if e.key.window_end_ms < windows[-1])


def test_20000_entries_list_and_load_quickly(tmp_path: Path) -> None:
    ledger = ReleaseLedger(tmp_path)
    template = entry(ReleaseKey(SPEC, None, 0)).to_json()
    spec_ids = [SPEC, "feature_usage@ffffffffffff"]
    for spec_id in spec_ids:
        ledger.path_of(ReleaseKey(spec_id, None, 0)).parent.mkdir(parents=True)
    for i in range(20_000):  # written directly (fsync per entry would time the disk, not the ledger)
        key = ReleaseKey(spec_ids[i % 2], f"v{i % 100}", 3_600_000 * (i // 100))
        with open(ledger.path_of(key), "w") as handle:
            handle.write(json.dumps({**template, "key": key.to_json()}))
    start = time.perf_counter()
    everything = list(ledger.entries())
    listed = time.perf_counter() - start
    start = time.perf_counter()
    one_spec = ledger.released(SPEC)
    looked_up = time.perf_counter() - start
    print(f"\n20,000 ledger entries: all listed+loaded in {listed:.2f} s; released(one spec) in {looked_up:.2f} s")
    assert len(everything) == 20_000 and len(one_spec) == 10_000
    assert listed < 20 and looked_up < 20  # smoke bound only; the measured time is printed


def test_seal_publishes_through_create_exclusive(tmp_path: Path) -> None:
    # A half-written entry can never be seen: the entry's file exists only once complete. Here a foreign
    # complete file at the key's path wins over a later seal, as any earlier decision must.
    ledger = ReleaseLedger(tmp_path)
    key = ReleaseKey(SPEC, None, 3_600_000)
    earlier = entry(key, digest="earlier")
    assert create_exclusive(ledger.path_of(key), json.dumps(earlier.to_json()).encode())
    assert ledger.seal(entry(key, digest="later")) == (earlier, False)
