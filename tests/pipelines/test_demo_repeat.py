"""A second ``esa demo`` into a used ``--out`` is refused before anything is produced: before, its reports were
all dead-lettered as late (the first run's windows are sealed in OUT.state) with exit 0, and its summary
compared the old estimates with the new truth."""

from __future__ import annotations

import pytest

from pipelines import cli
from pipelines.exit_codes import ExitCode

UNREACHABLE = "127.0.0.1:1"  # a demo that got past the check would fail on Kafka instead (exit 4)


@pytest.mark.parametrize("leftover", ["estimates/spec=x/part-1.parquet", "summary.json",
                                      "../demo.state/shuffle/ledger/app/w.json",
                                      "../demo.state/shuffle/releases/r.bin"])
def test_a_used_out_is_refused_before_publishing(tmp_path, capsys, leftover: str) -> None:
    out = tmp_path / "demo"
    out.mkdir()
    path = (out / leftover).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    code = cli.main(["demo", "--clients", "10", "--out", str(out), "--bootstrap", UNREACHABLE])
    err = capsys.readouterr().err
    assert code == ExitCode.CONFIG, err
    assert "already holds an earlier run's outputs" in err and f"rm -rf {out} {tmp_path / 'demo.state'}" in err
    assert len(err.strip().splitlines()) == 1


def test_an_out_without_sealed_windows_is_not_refused(tmp_path, monkeypatch) -> None:
    """An empty ``--out``, or one whose run was interrupted before it sealed a window."""
    from pipelines.demo import run

    class PastTheCheckError(Exception):
        pass

    def stop(*_args: object, **_kw: object) -> None:
        raise PastTheCheckError

    monkeypatch.setattr(run, "synthesize", stop)  # the next step after the check: stop there
    out = tmp_path / "demo"
    out.mkdir()
    (tmp_path / "demo.keys").mkdir()  # keys are kept between runs on purpose
    for left in ("encode/LOCK", "encode/run_state.json", "encode/staging/x", "shuffle/LOCK"):  # interrupted run
        (tmp_path / "demo.state" / left).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "demo.state" / left).write_bytes(b"")
    with pytest.raises(PastTheCheckError):
        run.run_demo(clients=10, mechanism=None, epsilon=None, out=out, bootstrap=UNREACHABLE)
