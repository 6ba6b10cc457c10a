"""Crash-safe file primitives and the per-state-directory lock.

Two publication rules keep every visible file complete:

- ``atomic_write_bytes`` writes a temporary file next to the target, fsyncs it, ``os.replace``\\ s it over
  the target and fsyncs the directory: after a kill -9 or a power loss the target is the old or the new
  content, never a mix (POSIX rename is atomic within a filesystem).
- ``create_exclusive`` publishes a fully written temporary file with ``os.link``, which fails if the target
  exists. It is the "decision" primitive: of any number of racing processes exactly one creates the file,
  and nobody ever sees it half written (``O_CREAT | O_EXCL`` plus writing would expose a partial file).

Temporary files are named ``.<target>.<random>.tmp``: the leading dot hides them from directory listings
of the state modules and from ``pyarrow.dataset`` discovery, so a crash leaves only invisible litter
(``remove_stale_temps`` sweeps it).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import socket
import time
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

TEMP_SUFFIX = ".tmp"
# what link(2) answers on a filesystem without hard links (FAT, some FUSE and network filesystems)
_NO_HARD_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EXDEV})


class StateError(RuntimeError):
    """State on disk that cannot be used as it is (corrupt, inconsistent, or held by another job)."""


class StateLocked(StateError):  # noqa: N818 (the name the jobs use)
    """Another live process holds the state directory's lock."""


def _fsync_dir(directory: Path) -> None:
    """Make a rename/link/creation in ``directory`` durable (a file's own fsync does not cover its name)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_dir(directory: Path) -> None:
    """Create ``directory`` and missing ancestors, fsyncing each new entry's parent so it survives a crash."""
    directory = Path(directory)
    missing = []
    probe = directory
    while not probe.is_dir():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for new in reversed(missing):
        with contextlib.suppress(FileExistsError):  # a racing process made it: fine
            new.mkdir()
        if not new.is_dir():
            raise StateError(f"{new} exists and is not a directory")
        _fsync_dir(new.parent)


def _temp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.{secrets.token_hex(8)}{TEMP_SUFFIX}")


def _write_temp(path: Path, data: bytes, mode: int = 0o644) -> Path:
    """Write ``data`` to a fresh temporary sibling of ``path`` and fsync it; return the temporary path."""
    ensure_dir(path.parent)
    temp = _temp_path(path)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
        raise
    os.close(fd)
    os.chmod(temp, mode)  # the umask may have narrowed (never widened) it; private files stay exactly ``mode``
    return temp


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` so that any crash leaves the old or the new complete file."""
    path = Path(path)
    temp = _write_temp(path, data, mode)
    try:
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
        raise
    _fsync_dir(path.parent)


def atomic_write_json(path: Path, obj: Any) -> None:
    """``atomic_write_bytes`` of ``obj`` as JSON (sorted keys, indent 1: stable and diffable)."""
    atomic_write_bytes(Path(path), (json.dumps(obj, sort_keys=True, indent=1) + "\n").encode("utf-8"))


def read_json(path: Path | str) -> Any | None:
    """The JSON in ``path``, or None if it does not exist. A corrupt file is an error naming it, not None:
    silently treating damaged state as absent could release a window twice."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        return None
    return parse_json(raw, path)


def parse_json(raw: bytes, path: Path | str) -> Any:
    """``raw`` as JSON; a corrupt file is a ``StateError`` naming ``path``."""
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise StateError(f"corrupt state file {path}: {err}. It was not written by esa (whose writes are "
                         "atomic) or the disk is damaged; inspect it, then move it away only if you know what it held"
                         ) from None


def create_exclusive(path: Path, data: bytes, mode: int = 0o644) -> bool:
    """Publish ``data`` at ``path`` only if nothing is there: True if we created it, False if it existed.

    The content is complete before the name appears (``os.link`` of an fsynced temporary file), so a reader
    that finds the file can trust it, and of racing creators exactly one gets True.
    """
    path = Path(path)
    temp = _write_temp(path, data, mode)
    try:
        os.link(temp, path)
    except FileExistsError:
        return False
    except OSError as err:
        if err.errno not in _NO_HARD_LINKS:
            raise  # a full disk (ENOSPC), a quota, a permission: the OS's own error says it best
        raise StateError(f"cannot create {path} by hard link ({err}); the state directory must be on a local "
                         "POSIX filesystem that supports hard links") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
    _fsync_dir(path.parent)
    return True


def is_temp(name: str) -> bool:
    """Whether a file name is one of our in-flight (or crash-abandoned) temporary files."""
    return name.startswith(".") and name.endswith(TEMP_SUFFIX)


def remove_stale_temps(directory: Path, min_age_s: float = 3600.0) -> int:
    """Delete temporary files older than ``min_age_s`` under ``directory`` (litter of killed writers).

    The age guard keeps a concurrent writer's live temporary file; returns how many files were removed.
    """
    removed, cutoff = 0, time.time() - min_age_s
    for root, _dirs, names in os.walk(directory):
        for name in names:
            if is_temp(name):
                candidate = Path(root) / name
                with contextlib.suppress(FileNotFoundError):
                    if candidate.stat().st_mtime < cutoff:
                        candidate.unlink()
                        removed += 1
    return removed


class StateLock:
    """Exclusive use of a state directory by one process: ``with StateLock(dir, "shuffle"): ...``.

    ``fcntl.flock`` on ``state_dir/LOCK`` belongs to the open file, so the kernel releases it when the process
    dies, however it dies (kill -9 included): there is no stale lock to clean up. The holder writes its pid,
    host, purpose and start time into the file so that a refused job can say who holds it. The file is never
    deleted (deleting a flock'ed file lets two processes lock two different inodes). flock is reliable on
    local filesystems only; do not put a state directory on NFS. The descriptor is close-on-exec, but a
    ``fork`` without exec would inherit the lock: start workers with spawn.
    """

    def __init__(self, state_dir: Path, purpose: str):
        self.state_dir = Path(state_dir)
        self.purpose = purpose
        self.path = self.state_dir / "LOCK"
        self._fd: int | None = None

    def acquire(self) -> StateLock:
        if self._fd is not None:
            raise StateError(f"{self.path} is already held by this StateLock")
        ensure_dir(self.state_dir)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise StateLocked(f"another esa job ({holder}) holds {self.path}; stop it or use another --state_dir") \
                from None
        except BaseException:
            os.close(fd)
            raise
        info = {"pid": os.getpid(), "host": socket.gethostname(), "purpose": self.purpose,
                "since": datetime.now(UTC).isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info, sort_keys=True) + "\n").encode("utf-8"), 0)
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)  # no stale holder info for the next reader
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> StateLock:
        return self.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    """Who holds the lock, from the file it wrote; the holder may not have written it yet."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
        return f"pid {info['pid']} on {info['host']}, {info['purpose']}, since {info['since']}"
    except (ValueError, KeyError, TypeError, OSError):
        return "holder unknown: it is starting or stopping"
