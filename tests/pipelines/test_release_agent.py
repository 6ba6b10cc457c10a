"""The streaming shuffler's release agent on staged files, without a broker: a window sealed before with another
digest is refused (nothing published), a withheld window is sealed as such, a release without its marker is
left alone, a marker whose parts are missing is an error, and staged dead letters move to the stage's domain.

Publishing would go to 127.0.0.1:1, where no broker listens: a test passes only if nothing was published.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import fastavro
import numpy as np
import pytest

from pipelines.job_config import JobConfig
from pipelines.targets import release_target
from schemas import encode_record  # noqa: F401  (schemas before trust's encoders)
from transforms.io.dead_letters import dead_letter
from transforms.io.staging import StagingError, write_batch
from transforms.shuffler.graph import ReleasePart
from transforms.shuffler.packed import PackedMessages
from transforms.shuffler.release_agent import ReleaseAgent
from transforms.shuffler.streaming import DEAD_DIR, MARKER, PART, StagedRelease, letter_name, release_dir
from transforms.spec import load_spec
from transforms.state.ledger import PUBLISHED, WITHHELD, ReleaseEntry, ReleaseKey, ReleaseLedger
from transforms.trust.keys import init_keys
from transforms.wire.elements import SourceRef

SPEC = load_spec(Path(__file__).resolve().parents[2] / "examples" / "app_language.toml")
END = 1_800_000_000_000 // 3_600_000 * 3_600_000


@pytest.fixture
def agent(tmp_path: Path) -> ReleaseAgent:
    init_keys(tmp_path / "keys")
    config = JobConfig(bootstrap="127.0.0.1:1", specs=(SPEC,), out_dir=tmp_path / "out", state_dir=tmp_path / "state",
                       keys_dir=tmp_path / "keys", shuffled_topic="never-written")
    return ReleaseAgent(release_target(config), config.specs, ReleaseLedger(config.state / "ledger"),
                        str(tmp_path / "staging"), "stream-test")


def _stage(agent: ReleaseAgent, end: int, n_sets: int, subkeys: tuple[int, ...] = (0, 1),
           marked: tuple[int, ...] | None = None, sets_in: int | None = None) -> str:
    rng = np.random.default_rng(end % 1000)
    root = agent._root
    parts = [ReleasePart(SPEC.spec_id, None, end, k, PackedMessages.of([(0, rng.bytes(40)) for _ in range(n_sets)])
                         if n_sets else (), n_sets, None, sets_in) for k in subkeys]
    directory = release_dir(root, parts[0])
    Path(directory).mkdir(parents=True)
    for part in parts:
        write_batch(directory, PART, [(f"{part.subkey:05d}", pickle.dumps(part))])
    if marked is not None:
        marker = StagedRelease((SPEC.spec_id, None, end), marked, {"reports/0": 77})
        write_batch(directory, MARKER, [(MARKER, pickle.dumps(marker))])
    return directory


def test_a_window_sealed_with_another_digest_is_refused_and_not_published(agent: ReleaseAgent) -> None:
    key = ReleaseKey(SPEC.spec_id, None, END)
    sealed = ReleaseEntry(key=key, release_id="earlier", digest="f" * 64, n_sets=9, n_messages=9, batches=1,
                          source_ends={"reports/0": 10}, run_key="bounded-run", sealed_at_ms=1, status=PUBLISHED)
    agent._ledger.seal(sealed)
    directory = _stage(agent, END, 50, marked=(0, 1))
    assert agent.step() == 1
    assert (agent.totals.released, agent.totals.conflicts) == (0, 1)
    assert agent._ledger.get(key) == sealed  # the earlier release stands
    assert not Path(directory).exists()  # handled: its staged files are gone
    assert not list((agent._target.state.releases).glob("*.bin"))  # its file discarded, never in place


def test_withheld_windows_are_sealed_as_withheld(agent: ReleaseAgent) -> None:
    _stage(agent, END + 3_600_000, 0, marked=(0, 1))
    agent.step()
    entry = agent._ledger.get(ReleaseKey(SPEC.spec_id, None, END + 3_600_000))
    assert entry is not None and entry.status == WITHHELD and entry.source_ends == {"reports/0": 77}
    assert agent.totals.withheld == 1 and agent._ledger.unpublished() == []


def test_a_release_is_handled_only_once_its_marker_is_staged(agent: ReleaseAgent) -> None:
    directory = _stage(agent, END, 5, marked=None)
    assert agent.step() == 0 and Path(directory).exists()
    assert agent._ledger.get(ReleaseKey(SPEC.spec_id, None, END)) is None


def test_a_marker_whose_parts_are_missing_is_an_error(agent: ReleaseAgent) -> None:
    _stage(agent, END, 5, subkeys=(0,), marked=(0, 1))
    with pytest.raises(StagingError, match="marker lists"):
        agent.step()
    assert agent._ledger.get(ReleaseKey(SPEC.spec_id, None, END)) is None


def test_staged_dead_letters_move_to_the_stage_domain_once(agent: ReleaseAgent) -> None:
    letters = [dead_letter("shuffle", "late: its window was already released", source=SourceRef("reports", 0, i),
                           spec_id=SPEC.spec_id) for i in range(5)]
    directory = Path(agent._root) / DEAD_DIR
    directory.mkdir(parents=True)
    write_batch(directory, "dead", [(letter_name(x), pickle.dumps(x)) for x in letters[:3]])
    write_batch(directory, "dead", [(letter_name(x), pickle.dumps(x)) for x in letters[2:]])  # a retried bundle
    agent.step()
    assert agent.totals.dead_letters == 5 and not list(directory.iterdir())
    (written,) = (agent._target.state.dead_letters).glob("dead-letters-stream-*.avro")
    with open(written, "rb") as handle:
        assert sorted(r["offset"] for r in fastavro.reader(handle)) == [0, 1, 2, 3, 4]
    agent.step()
    assert agent.totals.dead_letters == 5


def test_a_window_and_dead_letters_staged_again_by_a_restarted_job_are_counted_once(agent: ReleaseAgent) -> None:
    """A Flink job restored from a checkpoint replays bundles: it stages a window it fired before and letters the
    agent collected already. The durable accounting (``pipelines.stream_accounting``) counts each once."""
    end = END + 3_600_000
    _stage(agent, end, 0, marked=(0, 1), sets_in=7)  # a withheld window: 7 sets deleted in each sub-crowd
    letters = [dead_letter("shuffle", "bad signature", source=SourceRef("reports", 0, i), spec_id=SPEC.spec_id)
               for i in range(3)]
    directory = Path(agent._root) / DEAD_DIR
    directory.mkdir(parents=True)
    write_batch(directory, "dead", [(letter_name(x), pickle.dumps(x)) for x in letters])
    agent.step()
    assert (agent.totals.sets_decided, agent.totals.sets_released, agent.totals.dead_letters) == (14, 0, 3)
    _stage(agent, end, 0, marked=(0, 1), sets_in=7)  # the replay
    write_batch(directory, "dead", [(letter_name(x), pickle.dumps(x)) for x in letters[1:]])
    agent.step()
    assert (agent.totals.sets_decided, agent.totals.dead_letters) == (14, 3)
    assert len(list((agent._target.state.dead_letters).glob("dead-letters-stream-*.avro"))) == 1
    assert not list(directory.iterdir())  # the replayed letters' files are gone all the same


def test_a_part_staged_without_its_set_count_makes_the_durable_count_unknown(agent: ReleaseAgent) -> None:
    _stage(agent, END, 0, marked=(0, 1))  # sets_in None: staged by an esa before the count existed
    agent.step()
    assert agent.totals.sets_decided is None
