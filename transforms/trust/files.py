"""Durable, atomic file writes and guarded reads of secret files (shared by the keys and the device registry).

A key file that is half written after a crash is worse than none: it would be read as a wrong key. Every
write therefore goes to a temporary file in the same directory, is fsynced, then renamed over the target,
and the directory is fsynced so the rename itself survives a power cut.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from transforms.state.files import atomic_write_bytes


class KeyFileError(ValueError):
    """A key or registry file that is missing, of the wrong size or too widely readable; names the file."""


def ensure_dir(directory: Path, mode: int = 0o700) -> Path:
    """Create ``directory`` (and parents) if missing; new private directories are owner-only."""
    directory.mkdir(mode=mode, parents=True, exist_ok=True)
    return directory


def atomic_write(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Replace ``path`` by ``data`` atomically (the state library's crash-safe write), private by default."""
    path = Path(path)
    ensure_dir(path.parent)
    atomic_write_bytes(path, data, mode)


def check_private(path: Path) -> None:
    """Refuse a private file that group or others may read or write (as ssh does for its keys)."""
    mode = os.stat(path).st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(f"{path}: private key file is accessible by group/others (mode {stat.S_IMODE(mode):o}); "
                           f"run: chmod 600 {path}")


def read_key_file(path: Path, size: int = 32, private: bool = True) -> bytes:
    """Read a raw key of exactly ``size`` bytes, refusing missing, wrongly sized or exposed private files."""
    path = Path(path)
    if not path.is_file():
        raise KeyFileError(f"{path}: key file is missing")
    if private:
        check_private(path)
    data = path.read_bytes()
    if len(data) != size:
        raise KeyFileError(f"{path}: expected {size} raw bytes, found {len(data)}")
    return data
