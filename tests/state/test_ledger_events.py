"""Typed privacy events in the analyst's ledger (``transforms.privacy.events``).

Against a ledger written by the esa before events (``legacy/``, written by ``legacy/write.py`` at 3ec1088 with
the rows it published): it loads, migrates on rewrite, and releasing on top of it publishes byte-identical rows;
the same releases replayed from scratch publish byte-identical rows too. Every stored event recomputes, in the
one place (``events.central_epsilon``), the eps_central its row published."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from transforms.privacy import event_json
from transforms.privacy.events import (
    EVENT_VERSION,
    NeighbouringRelation,
    WindowEvent,
    central_epsilon,
    window_event,
)
from transforms.state.ledger import LEGACY_ACCOUNT, ReleaseEntry, ReleaseLedger

LEGACY = Path(__file__).parent / "legacy"
sys.path.insert(0, str(LEGACY))
import scenario  # noqa: E402


def _published() -> list[str]:
    return [json.dumps(r, sort_keys=True, default=str) for r in json.loads((LEGACY / "rows.json").read_text())]


def _dumped(rows: list[dict]) -> list[str]:
    """Rows as the fixture holds them (datetimes as str, then through JSON like the fixture's file)."""
    return [json.dumps(json.loads(json.dumps(r, default=str)), sort_keys=True) for r in rows]


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """Today's esa releasing the fixture's sequence from scratch (module-scoped: the one costly part)."""
    root = tmp_path_factory.mktemp("replay")
    return root, _dumped(scenario.run(root, scenario.releases()))


def test_the_same_releases_publish_byte_identical_rows(replayed: tuple[Path, list[str]]) -> None:
    assert replayed[1] == _published()


def test_a_legacy_ledger_loads_and_releasing_on_top_of_it_publishes_identical_rows(tmp_path: Path) -> None:
    shutil.copytree(LEGACY / "ledger", tmp_path / "ledger")
    raw = [json.loads(p.read_text()) for p in sorted((tmp_path / "ledger").rglob("*.json"))]
    assert raw and all(LEGACY_ACCOUNT in r["extra"] and "event" not in r for r in raw)  # the old format
    entries = list(ReleaseLedger(tmp_path / "ledger").entries())
    assert len(entries) == scenario.SPLIT and all(isinstance(e.event, WindowEvent) for e in entries)
    assert all(LEGACY_ACCOUNT not in e.extra for e in entries)
    olh = next(e.event for e in entries if e.event.mechanism == "olh")
    assert olh.relation is NeighbouringRelation.REPLACEMENT_ACROSS_PARTITIONS and olh.composes_by_pld
    assert olh.count_charges == olh.relation.count_charges == 2
    grr = next(e.event for e in entries if e.event.mechanism == "grr")
    assert grr.own_accountant and not grr.composes_by_pld  # two reports per client: its (eps, delta)
    rows = scenario.run(tmp_path, scenario.releases()[scenario.SPLIT:])
    assert _dumped(rows) == _published()[scenario.SPLIT:]


def test_every_stored_event_recomputes_its_published_epsilon(replayed: tuple[Path, list[str]]) -> None:
    root, rows = replayed
    published = {(r["spec_id"], r["crowd_id"], r["window_end"]): r for r in map(json.loads, rows)}
    files = sorted((root / "ledger").rglob("*.json"))
    assert len(files) == len(scenario.releases())
    for path in files:
        stored = json.loads(path.read_text())
        assert LEGACY_ACCOUNT not in stored["extra"] and stored["event"]["version"] == EVENT_VERSION
        entry = ReleaseEntry.from_json(stored)
        row = published[(entry.key.spec_id, entry.key.crowd_id, entry.key.window_end_ms)]
        assert entry.event.relation.value == row["notion"]  # every published epsilon names its notion
        assert (entry.event.eps_central, entry.event.bound) == (
            row["eps_central"], json.loads(row["parameters"])["eps_central_bound"])
        result = central_epsilon(entry.event)
        assert (result.epsilon, result.bound) == (row["eps_central"], entry.event.bound)
        assert event_json.from_json(json.loads(json.dumps(event_json.to_json(entry.event)))) == entry.event


def test_a_migrated_entry_is_rewritten_as_an_event(tmp_path: Path) -> None:
    shutil.copytree(LEGACY / "ledger", tmp_path / "ledger")
    ledger = ReleaseLedger(tmp_path / "ledger")
    entry = next(iter(ledger.entries()))
    (tmp_path / "ledger" / f"{entry.key.slug}.json").unlink()
    assert ledger.seal(entry)[1]
    stored = json.loads((tmp_path / "ledger" / f"{entry.key.slug}.json").read_text())
    assert LEGACY_ACCOUNT not in stored["extra"] and stored["event"]["format"] == event_json.EVENT_FORMAT
    assert ledger.get(entry.key) == entry


def test_events_refuse_what_they_cannot_mean() -> None:
    from transforms.mechanisms.registry import build_mechanism

    grr = build_mechanism("grr", "histogram", {"d": 8}, 2.0, {})
    event = window_event(grr, 1_000, 1e-6)
    good = event_json.to_json(event)
    with pytest.raises(ValueError, match="version"):
        event_json.from_json({**good, "version": EVENT_VERSION + 1})
    with pytest.raises(ValueError, match="unknown fields"):
        event_json.from_json({**good, "epsilon_total": 1.0})
    with pytest.raises(ValueError, match="not a window event"):
        event_json.from_json({**good, "format": "esa-ledger-withheld"})
    with pytest.raises(ValueError):
        event_json.from_json({**good, "relation": "add-remove"})
    with pytest.raises(ValueError, match="own_epsilon"):
        central_epsilon(WindowEvent("x", NeighbouringRelation.REPLACEMENT, 100, 1e-6, 1.0, own_accountant=True))
    assert NeighbouringRelation.of_claims(True, True).value == "replacement across partitions + membership"
    with pytest.raises(ValueError, match="removal"):
        _ = NeighbouringRelation.REMOVAL.count_charges
