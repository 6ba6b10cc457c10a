"""A damaged state file stops a job before it reads anything: one line naming the file, exit 8, and the
state left as it was for the operator to inspect (guessing around it could release a window twice)."""

from __future__ import annotations

import pytest

from pipelines import cli
from pipelines.demo.population import synthesize
from pipelines.exit_codes import ExitCode
from tests.e2e.chain_harness import SPEC_PATH, cli_argv, ledger_entries, new_chain, produce, recent_start, run_inline
from transforms.spec import load_spec

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("damage", "words"), [
    (b'{"resume": {"rep/0": 5', "corrupt state file"),  # torn or overwritten by something else
    (b'{"resume": {"rep/0": "five"}}', "invalid run state"),  # valid JSON that is not a run state
])
def test_a_damaged_run_state_is_one_line_and_exit_8(broker, tmp_path, capsys, damage: bytes, words: str) -> None:
    spec = load_spec(SPEC_PATH)
    chain = new_chain(broker.bootstrap, tmp_path, "damaged")
    produce(chain, synthesize(spec, 200, windows=1, start_ms=recent_start(spec.window_seconds * 1000), seed=3))
    run_inline(chain, ("encode",))
    state_file = chain.state("shuffle") / "run_state.json"
    state_file.parent.mkdir(parents=True)
    state_file.write_bytes(damage)

    assert cli.main(cli_argv(chain, "shuffle")[3:]) == ExitCode.STATE_UNUSABLE == 8
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("esa shuffle: error: unusable state: ") and words in err[-1], err
    assert str(state_file) in err[-1]
    assert state_file.read_bytes() == damage and ledger_entries(chain, "shuffle") == []  # untouched, nothing released


def test_a_damaged_ledger_entry_is_one_line_and_exit_8(broker, tmp_path, capsys) -> None:
    spec = load_spec(SPEC_PATH)
    chain = new_chain(broker.bootstrap, tmp_path, "ledger")
    produce(chain, synthesize(spec, 200, windows=1, start_ms=recent_start(spec.window_seconds * 1000), seed=4))
    run_inline(chain, ("encode", "shuffle"))
    entries = sorted((chain.state("shuffle") / "ledger").rglob("*.json"))
    assert entries, "the first run sealed nothing"
    entries[0].write_bytes(entries[0].read_bytes()[:-9])  # torn, as only a damaged disk or another writer can

    assert cli.main(cli_argv(chain, "shuffle")[3:]) == ExitCode.STATE_UNUSABLE
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("esa shuffle: error: unusable state: corrupt state file ") and str(entries[0]) in err
