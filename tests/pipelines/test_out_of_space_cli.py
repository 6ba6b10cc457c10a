"""Writes refused for lack of space are recognized however they reach the command (raised directly, chained,
or flattened into the text of Beam's RuntimeError) and end in one line with exit 7; nothing else does."""

from __future__ import annotations

import errno

import pytest

from pipelines import cli
from pipelines.exit_codes import ExitCode
from pipelines.out_of_space import out_of_space

BEAM_TEXT = ("OSError: [Errno 28] No space left on device [while running 'Ingress/ParDo(IngressFn)']\n"
             "Traceback (most recent call last): ...")


def _chained() -> RuntimeError:
    try:
        try:
            raise OSError(errno.EDQUOT, "Disk quota exceeded", "/state/ledger/x")
        except OSError as inner:
            raise RuntimeError("the release could not be sealed") from inner
    except RuntimeError as outer:
        return outer


@pytest.mark.parametrize(("err", "words"), [
    (OSError(errno.ENOSPC, "No space left on device", "/s/a.spill"),
     "[Errno 28] No space left on device: '/s/a.spill'"),
    (OSError(errno.EFBIG, "File too large"), "[Errno 27] File too large"),
    (_chained(), "[Errno 122] Disk quota exceeded: '/state/ledger/x'"),
    (RuntimeError(BEAM_TEXT), "[Errno 28] No space left on device"),
    (RuntimeError("OSError: [Errno 122] Disk quota exceeded: '/out/x.parquet'. More"),
     "[Errno 122] Disk quota exceeded: '/out/x.parquet'"),
])
def test_refusals_for_space_are_recognized(err: BaseException, words: str) -> None:
    assert out_of_space(err) == words


@pytest.mark.parametrize("err", [
    OSError(errno.EACCES, "Permission denied", "/state"),
    FileNotFoundError(errno.ENOENT, "No such file or directory", "/x"),
    RuntimeError("OSError: [Errno 2] No such file or directory"),
    RuntimeError("OSError: [Errno 280] not an errno of ours"),
    ValueError("28 No space left"),  # the words alone, without the OS's errno, are not enough
])
def test_other_errors_are_not(err: BaseException) -> None:
    assert out_of_space(err) is None


def test_a_cycle_in_the_chain_ends() -> None:
    first, second = RuntimeError("a"), RuntimeError("b")
    first.__context__, second.__context__ = second, first
    assert out_of_space(first) is None


def test_the_command_says_one_line_and_exits_7(capsys) -> None:
    assert cli._error_code("shuffle", RuntimeError(BEAM_TEXT)) == ExitCode.OUT_OF_SPACE == 7
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("esa shuffle: error: out of space: [Errno 28] No space left")
    assert "Nothing is lost and nothing will be released twice" in err and "same flags" in err
    assert cli._error_code("shuffle", PermissionError(errno.EACCES, "Permission denied")) is None  # a traceback


def test_main_maps_a_refused_write_to_exit_7(monkeypatch, capsys) -> None:
    def refuse(_args):
        raise OSError(errno.ENOSPC, "No space left on device", "/out/estimates")

    monkeypatch.setattr(cli, "_dispatch", refuse)
    argv = ["plan", "--kind", "histogram", "--d", "64", "--n", "1000", "--delta", "1e-6"]
    assert cli.main(argv) == ExitCode.OUT_OF_SPACE
    assert "out of space: [Errno 28] No space left on device: '/out/estimates'" in capsys.readouterr().err
