"""The device's state directory: an exclusive lock, crash-safe JSON files and the device signing key.

Layout of ``state_dir`` (owner-only, 0700)::

    device.key          Ed25519 seed of the device (raw 32 bytes, 0600), created on first use
    lock                flock(2) target: every read-modify-write of the files below holds it
    budget.json         the privacy budget of the current epoch (``budget.py``)
    budget_policy.json  the device's budget: limit and epoch length, and a pending change (``policy.py``)
    memo/<hash>.json    permanent randomization per (metric, backstop parameters) (``memo.py``)

Every JSON file is replaced atomically (temporary file in the same directory, fsync, rename, fsync of the
directory), so a crash at any instant leaves either the old or the new content, never a torn file. The
lock is ``flock`` on a separate file (never on a file that is renamed over), so two processes, or two
``Client`` objects of one process, serialise their updates. POSIX only (Linux, Android, macOS).
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from transforms.trust.files import atomic_write, ensure_dir
from transforms.trust.keys import load_or_create_secret

__all__ = ["StateError", "load_device_key", "locked", "read_json", "state_directory", "write_json"]

LOCK_FILE = "lock"
KEY_FILE = "device.key"


class StateError(RuntimeError):
    """A state file that exists but cannot be used (corrupt, foreign format); names the file."""


def state_directory(path: Path) -> Path:
    """Create the state directory (owner-only) if needed and return it as a Path."""
    return ensure_dir(Path(path), mode=0o700)


@contextmanager
def locked(state_dir: Path) -> Iterator[None]:
    """Hold the state directory's exclusive lock (blocking) for the duration of the block."""
    fd = os.open(Path(state_dir) / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock, also if the block raised


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object at ``path``, None if the file does not exist; ``StateError`` if it is not an object."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise StateError(f"{path}: not valid JSON ({err}); the device state is corrupt") from None
    if not isinstance(value, dict):
        raise StateError(f"{path}: expected a JSON object")
    return value


def write_json(path: Path, value: dict[str, Any]) -> None:
    """Replace ``path`` by ``value`` atomically and durably (0600)."""
    atomic_write(Path(path), json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8"))


def load_device_key(state_dir: Path) -> Ed25519PrivateKey:
    """The device's Ed25519 key from ``state_dir/device.key``, created from OS entropy on first use.

    Creation is race-safe (two processes starting together agree on one key) and the file must stay
    owner-only: a group- or world-readable key file is refused, as ssh refuses one.
    """
    return Ed25519PrivateKey.from_private_bytes(load_or_create_secret(Path(state_dir) / KEY_FILE))
