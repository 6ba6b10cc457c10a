"""Crash safety and exclusivity of the state file primitives, checked with real processes and kill -9."""

from __future__ import annotations

import errno
import hashlib
import os
import signal
import time
from pathlib import Path

import pytest

from tests.state.racing import kill_9_when_ready, race, spawn
from transforms.state.files import (
    StateError,
    StateLock,
    StateLocked,
    atomic_write_bytes,
    atomic_write_json,
    create_exclusive,
    is_temp,
    read_json,
    remove_stale_temps,
)

# --- single-process behaviour ----------------------------------------------------------------------------------

def test_atomic_write_creates_parents_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "state.bin"
    atomic_write_bytes(path, b"one")
    atomic_write_bytes(path, b"two")
    assert path.read_bytes() == b"two"
    assert os.listdir(path.parent) == ["state.bin"]


def test_json_round_trip_sorted_and_missing_is_none(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    assert read_json(path) is None
    atomic_write_json(path, {"b": 1, "a": [1, 2]})
    assert read_json(path) == {"a": [1, 2], "b": 1}
    assert path.read_text().index('"a"') < path.read_text().index('"b"')


def test_corrupt_json_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_bytes(b'{"a": 1')
    with pytest.raises(StateError, match=r"broken\.json"):
        read_json(path)


def test_create_exclusive_creates_once_and_keeps_the_first(tmp_path: Path) -> None:
    path = tmp_path / "d" / "decision"
    assert create_exclusive(path, b"first") is True
    assert create_exclusive(path, b"second") is False
    assert path.read_bytes() == b"first"
    assert os.listdir(path.parent) == ["decision"]  # temporary files are always removed


def test_remove_stale_temps_keeps_young_and_real_files(tmp_path: Path) -> None:
    old, young, real = tmp_path / ".x.json.ab.tmp", tmp_path / ".y.json.cd.tmp", tmp_path / "x.json"
    for p in (old, young, real):
        p.write_bytes(b"")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert remove_stale_temps(tmp_path, min_age_s=3600) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([young.name, real.name])


# --- kill -9 in the middle of writing ------------------------------------------------------------------------------

WRITER = """
    import hashlib, os, sys
    from pathlib import Path
    from transforms.state.files import atomic_write_bytes, create_exclusive
    root, size = Path(sys.argv[1]), int(sys.argv[2])
    for i in range(10**6):
        body = os.urandom(size)
        blob = hashlib.sha256(body).digest() + body   # self-checking: a partial file fails the digest
        atomic_write_bytes(root / f"replace-{i % 3}.bin", blob)
        create_exclusive(root / f"exclusive-{i}.bin", blob)
        if i == 0:
            print("ready", flush=True)
"""


def _complete(path: Path) -> bool:
    blob = path.read_bytes()
    return len(blob) > 32 and hashlib.sha256(blob[32:]).digest() == blob[:32]


@pytest.mark.parametrize("kill_after_s", [0.0, 0.05, 0.13, 0.31])
def test_kill_9_while_writing_leaves_only_complete_files(tmp_path: Path, kill_after_s: float) -> None:
    child = kill_9_when_ready(WRITER, str(tmp_path), str(2 << 20), after_s=kill_after_s)
    assert child.returncode == -signal.SIGKILL
    visible = [p for p in tmp_path.iterdir() if not is_temp(p.name)]
    assert all(p.name.startswith(("replace-", "exclusive-")) for p in visible), visible
    assert any(p.name.startswith("replace-") for p in visible)
    broken = [p.name for p in visible if not _complete(p)]
    assert broken == [], f"partial files visible after kill -9: {broken}"


NAIVE_WRITER = """
    import hashlib, os, sys, time
    from pathlib import Path
    root, size = Path(sys.argv[1]), int(sys.argv[2])
    for i in range(10**6):
        body = os.urandom(size)
        blob = hashlib.sha256(body).digest() + body
        with open(root / f"replace-{i % 3}.bin", "wb") as f:   # in place, in slow chunks: visibly partial
            for start in range(0, len(blob), 1 << 16):
                f.write(blob[start:start + (1 << 16)])
                f.flush()
                time.sleep(0.002)
        if i == 0:
            print("ready", flush=True)
"""


def test_the_check_detects_partial_files_of_a_naive_writer(tmp_path: Path) -> None:
    # Negative control: the same kill and the same check catch a writer that writes in place.
    kill_9_when_ready(NAIVE_WRITER, str(tmp_path), str(1 << 20), after_s=0.02)
    assert any(not _complete(p) for p in tmp_path.iterdir())


# --- races between processes ---------------------------------------------------------------------------------------

def _race_create(me: int, path: Path) -> bool:
    return create_exclusive(path, f"winner {me}".encode() * 1000)


def test_create_exclusive_has_exactly_one_winner_among_8_processes(tmp_path: Path) -> None:
    for round_ in range(3):
        path = tmp_path / f"decision-{round_}"
        wins = race(8, _race_create, path)
        assert sum(wins) == 1, wins
        assert path.read_bytes() == f"winner {wins.index(True)}".encode() * 1000
    assert not [p for p in tmp_path.iterdir() if is_temp(p.name)]


# --- the state directory lock --------------------------------------------------------------------------------------

HOLDER = """
    import sys, time
    from pathlib import Path
    from transforms.state.files import StateLock
    with StateLock(Path(sys.argv[1]), "shuffle"):
        print("locked", flush=True)
        time.sleep(120)
"""


def test_lock_contention_names_the_holder_and_kill_9_releases_it(tmp_path: Path) -> None:
    holder = spawn(HOLDER, str(tmp_path))
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        with pytest.raises(StateLocked) as info, StateLock(tmp_path, "analyze"):
            pass
        message = str(info.value)
        assert f"pid {holder.pid}" in message and "shuffle" in message and "since 20" in message
        assert str(tmp_path / "LOCK") in message and "--state_dir" in message
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with StateLock(tmp_path, "analyze") as lock:  # the kernel dropped the dead holder's lock
        assert lock.held
        assert f'"pid": {os.getpid()}' in (tmp_path / "LOCK").read_text()


def test_lock_excludes_a_second_holder_in_the_same_process_until_released(tmp_path: Path) -> None:
    first = StateLock(tmp_path / "state", "shuffle").acquire()
    with pytest.raises(StateLocked, match="shuffle"):
        StateLock(tmp_path / "state", "shuffle").acquire()
    first.release()
    assert not first.held
    with StateLock(tmp_path / "state", "shuffle"):
        pass


@pytest.mark.parametrize("code", [errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV])
def test_a_filesystem_without_hard_links_is_one_state_error(tmp_path: Path, monkeypatch, code: int) -> None:
    """No filesystem here lacks hard links, so link(2)'s answer on one (FAT, some FUSE mounts) is simulated."""
    monkeypatch.setattr(os, "link", lambda *_a: (_ for _ in ()).throw(OSError(code, os.strerror(code))))
    with pytest.raises(StateError, match="must be on a local POSIX filesystem that supports hard links"):
        create_exclusive(tmp_path / "entry", b"x")
    assert list(tmp_path.iterdir()) == []  # the temporary file is gone too


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EACCES])
def test_other_link_failures_keep_the_os_error(tmp_path: Path, monkeypatch, code: int) -> None:
    """A full disk can refuse the new directory entry itself: that must read as out of space (exit 7), not as
    a filesystem without hard links."""
    monkeypatch.setattr(os, "link", lambda *_a: (_ for _ in ()).throw(OSError(code, os.strerror(code))))
    with pytest.raises(OSError) as caught:
        create_exclusive(tmp_path / "entry", b"x")
    assert caught.value.errno == code and not isinstance(caught.value, StateError)
    assert list(tmp_path.iterdir()) == []
