"""Output locations keep URLs intact and explain unusable local directories; the example specs are found
through the package. (The input-topic preflight is tested in test_preflight.py.)"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from pipelines import cli, cli_parser
from pipelines.examples import example_names, example_path
from pipelines.exit_codes import ExitCode
from pipelines.paths import OutputLocationError, is_url, output_location

REPO_EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("url", ["gs://bucket/esa", "gs://bucket/esa/", "s3://b/x", "hdfs://nn:8020/out"])
def test_urls_stay_urls(url: str) -> None:
    location = output_location(url)
    assert location.is_url and is_url(url)
    assert location.join("estimates.parquet") == url.rstrip("/") + "/estimates.parquet"
    assert location.join("a", "/b") == url.rstrip("/") + "/a/b"
    assert location.prepare() is location  # nothing to create on an object store


def test_local_locations_are_paths(tmp_path: Path) -> None:
    for text in (str(tmp_path / "out"), f"file://{tmp_path}/out"):
        location = output_location(text)
        assert not location.is_url and location.join("x.parquet") == tmp_path / "out" / "x.parquet"
    location = output_location(tmp_path / "a" / "b").prepare()
    assert (tmp_path / "a" / "b").is_dir() and str(location) == str(tmp_path / "a" / "b")


def test_a_file_in_the_way_is_one_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OutputLocationError, match="a file is in the way"):
        output_location(blocker).prepare()
    with pytest.raises(OutputLocationError, match=r"is a file, not a directory"):
        output_location(blocker / "sub" / "dir").prepare()
    assert OutputLocationError("x").exit_code == ExitCode.CONFIG


NOBODY = 65534  # the conventional unprivileged uid/gid; root ignores directory modes, so root tests as it


def _refusal(target: Path) -> str:
    """The one-line refusal ``prepare`` gives for ``target``, or "" if it accepted it."""
    try:
        output_location(target).prepare()
    except OutputLocationError as err:
        return str(err)
    return ""


def _refusal_unprivileged(target: Path) -> str:
    """``_refusal`` as this user, or, under root, in a forked child that has dropped to ``nobody`` first."""
    if os.geteuid() != 0:
        return _refusal(target)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop privileges, answer through the pipe, never return into pytest
        status = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.write(write_end, _refusal(target).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as answer:
        text = answer.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the unprivileged child failed"
    return text


@pytest.fixture
def shared_dir(tmp_path: Path):
    """A directory the unprivileged user can reach: pytest's own base is private to its user (0700)."""
    if os.geteuid() != 0:
        yield tmp_path
        return
    scratch = Path(tempfile.mkdtemp(prefix="esa-perm-", dir="/tmp"))  # /tmp itself is world-traversable
    scratch.chmod(0o755)
    try:
        yield scratch
    finally:
        for path in [scratch, *scratch.rglob("*")]:
            if path.is_dir():
                path.chmod(0o700)
        shutil.rmtree(scratch)


def test_permission_denied_is_one_clear_error(shared_dir: Path) -> None:
    locked = shared_dir / "locked"
    locked.mkdir(mode=0o555)  # anyone may enter it; nobody but root may write into it
    open_dir = shared_dir / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    assert _refusal_unprivileged(locked / "out") == f"cannot create output directory {locked / 'out'}: " \
        "permission denied"
    assert _refusal_unprivileged(locked) == f"cannot write to output directory {locked}: permission denied"
    assert _refusal_unprivileged(open_dir / "out") == ""  # the same user where it may write: accepted


def test_demo_refuses_an_unusable_out_before_any_work(tmp_path: Path, capsys) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert cli.main(["demo", "--clients", "100", "--out", str(blocker / "out")]) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "not a directory" in err


def test_examples_are_found_through_the_package() -> None:
    names = example_names()
    assert "app_language.toml" in names and sorted(p.name for p in REPO_EXAMPLES.glob("*.toml")) == names
    assert example_path("grid").read_bytes() == (REPO_EXAMPLES / "grid.toml").read_bytes()
    assert cli_parser.DEFAULT_SPEC.resolve() == example_path().resolve()
    with pytest.raises(ValueError, match=r"the examples are: .*app_language\.toml"):
        example_path("no_such_example")
