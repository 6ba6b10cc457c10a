"""The keys directory: one raw key per file, private files 0600, every key named by a rotating key id.

Layout (each trust domain reads only its own subdirectory plus ``public/``)::

    analyzer/<key_id>.x25519              analyzer private keys (raw 32 bytes)
    shuffler/<key_id>.ed25519             shuffler signing seeds (raw 32 bytes)
    shuffler/<key_id>.x25519              shuffler sealing keys: devices seal whole message sets to them
    shuffler/prf.key                      the shuffler's PRF key (kept so a rerun reproduces a release)
    encoder/prf.key                       the edge encoder's PRF key
    encoder/fleet.key                     master secret of *simulated* devices (simulation and demos only)
    public/analyzer-<key_id>.x25519.pub   raw 32-byte public keys, readable by anyone
    public/shuffler-<key_id>.ed25519.pub
    public/shuffler-<key_id>.x25519.pub   what devices seal their message sets to (``trust.envelope``)
    registry/devices.parquet              enrolled devices (shuffler domain)

Key ids are ``YYYYMMDD-`` + 8 random hex digits, so keys sort by creation day (two keys of one day by the
time their files were written): senders always use the newest key while receivers keep every id they hold,
which lets keys rotate without a flag day.
"""

from __future__ import annotations

import os
import re
import secrets
from datetime import UTC, datetime
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from transforms.state.files import create_exclusive

from .files import KeyFileError, atomic_write, ensure_dir, read_key_file
from .layout import KeysDir

__all__ = [
    "KEY_ID_PATTERN",
    "KeyFileError",
    "generate_analyzer_key",
    "generate_shuffler_key",
    "generate_shuffler_sealing_key",
    "init_keys",
    "load_analyzer_private",
    "load_analyzer_public",
    "load_analyzer_publics",
    "load_or_create_secret",
    "load_shuffler_sealing_private",
    "load_shuffler_sealing_public",
    "load_shuffler_signer",
    "load_shuffler_verifiers",
    "new_key_id",
]

KEY_ID_PATTERN = re.compile(r"[0-9]{8}-[0-9a-f]{8}")
SECRET_BYTES = 32


def new_key_id(now: datetime | None = None) -> str:
    """``YYYYMMDD-`` (UTC creation date) + 8 random hex digits: unique, and the newest sorts last."""
    day = (now or datetime.now(UTC)).strftime("%Y%m%d")
    return f"{day}-{secrets.token_hex(4)}"


def _public_dir(keys_dir: Path) -> Path:
    return ensure_dir(KeysDir(Path(keys_dir)).public, mode=0o755)


def generate_analyzer_key(keys_dir: Path) -> str:
    """Create a new analyzer X25519 key pair; returns its key id (senders pick it up as the newest)."""
    key = X25519PrivateKey.generate()
    key_id = new_key_id()
    atomic_write(ensure_dir(KeysDir(Path(keys_dir)).analyzer) / f"{key_id}.x25519", key.private_bytes_raw())
    atomic_write(_public_dir(keys_dir) / f"analyzer-{key_id}.x25519.pub", key.public_key().public_bytes_raw(),
                 mode=0o644)
    return key_id


def generate_shuffler_key(keys_dir: Path) -> str:
    """Create a new shuffler Ed25519 signing key; returns its key id."""
    key = Ed25519PrivateKey.generate()
    key_id = new_key_id()
    atomic_write(ensure_dir(KeysDir(Path(keys_dir)).shuffler) / f"{key_id}.ed25519", key.private_bytes_raw())
    atomic_write(_public_dir(keys_dir) / f"shuffler-{key_id}.ed25519.pub", key.public_key().public_bytes_raw(),
                 mode=0o644)
    return key_id


def generate_shuffler_sealing_key(keys_dir: Path) -> str:
    """Create a new shuffler X25519 sealing key pair (the outer layer of nested encryption); returns its id.

    Rotation is lossless by construction: devices can seal to a key only once its public file exists, which
    is after its private file, and the shuffler keeps opening envelopes sealed to every id it holds."""
    key = X25519PrivateKey.generate()
    key_id = new_key_id()
    atomic_write(ensure_dir(KeysDir(Path(keys_dir)).shuffler) / f"{key_id}.x25519", key.private_bytes_raw())
    atomic_write(_public_dir(keys_dir) / f"shuffler-{key_id}.x25519.pub", key.public_key().public_bytes_raw(),
                 mode=0o644)
    return key_id


def _keyed_files(directory: Path, prefix: str, suffix: str, what: str) -> dict[str, Path]:
    """``key_id -> path`` of the files ``<prefix><key_id><suffix>`` in ``directory``, sorted by id."""
    if not directory.is_dir():
        raise KeyFileError(f"{directory}: {what} directory is missing (create keys with init_keys)")
    found: dict[str, Path] = {}
    for path in directory.iterdir():
        name = path.name
        if name.startswith(prefix) and name.endswith(suffix):
            key_id = name[len(prefix):len(name) - len(suffix)]
            if KEY_ID_PATTERN.fullmatch(key_id):
                found[key_id] = path
    if not found:
        raise KeyFileError(f"{directory}: no {what} keys ({prefix}<key_id>{suffix}) found")
    return dict(sorted(found.items()))


def _newest(files: dict[str, Path]) -> tuple[str, Path]:
    """The newest key: latest creation date in its id, then (two keys of one day, whose random parts sort in
    no particular order) the file written last, then the id."""
    return max(files.items(), key=lambda item: (item[0][:8], item[1].stat().st_mtime_ns, item[0]))


def load_analyzer_private(keys_dir: Path) -> dict[str, X25519PrivateKey]:
    """Every analyzer private key by id, so blobs sealed to a retired key still open during rotation."""
    files = _keyed_files(KeysDir(Path(keys_dir)).analyzer, "", ".x25519", "analyzer private")
    return {key_id: X25519PrivateKey.from_private_bytes(read_key_file(path)) for key_id, path in files.items()}


def load_analyzer_public(keys_dir: Path) -> tuple[str, X25519PublicKey]:
    """The newest analyzer public key (what encoders seal to) and its id, read from ``public/``."""
    files = _keyed_files(KeysDir(Path(keys_dir)).public, "analyzer-", ".x25519.pub", "analyzer public")
    key_id, path = _newest(files)
    return key_id, X25519PublicKey.from_public_bytes(read_key_file(path, private=False))


def load_analyzer_publics(keys_dir: Path) -> dict[str, X25519PublicKey]:
    """Every analyzer public key by id (from ``public/``): the shuffler seals its dummy reports to the key of
    the real messages they stand beside (``transforms.shuffler.blanket``), whichever ids a rotation left."""
    files = _keyed_files(KeysDir(Path(keys_dir)).public, "analyzer-", ".x25519.pub", "analyzer public")
    out: dict[str, X25519PublicKey] = {}
    for key_id, path in files.items():
        try:
            out[key_id] = X25519PublicKey.from_public_bytes(read_key_file(path, private=False))
        except ValueError as err:
            if isinstance(err, KeyFileError):
                raise
            raise KeyFileError(f"{path}: not a valid X25519 public key") from None
    return out


def load_shuffler_sealing_private(keys_dir: Path) -> dict[str, X25519PrivateKey]:
    """Every shuffler sealing private key by id: envelopes sealed to a retired key still open."""
    files = _keyed_files(KeysDir(Path(keys_dir)).shuffler, "", ".x25519", "shuffler sealing")
    return {key_id: X25519PrivateKey.from_private_bytes(read_key_file(path)) for key_id, path in files.items()}


def load_shuffler_sealing_public(keys_dir: Path) -> tuple[str, X25519PublicKey]:
    """The newest shuffler sealing public key (what devices seal their message sets to) and its id."""
    files = _keyed_files(KeysDir(Path(keys_dir)).public, "shuffler-", ".x25519.pub", "shuffler sealing public")
    key_id, path = _newest(files)
    return key_id, X25519PublicKey.from_public_bytes(read_key_file(path, private=False))


def load_shuffler_signer(keys_dir: Path) -> tuple[str, Ed25519PrivateKey]:
    """The newest shuffler signing key and its id."""
    files = _keyed_files(KeysDir(Path(keys_dir)).shuffler, "", ".ed25519", "shuffler signing")
    key_id, path = _newest(files)
    return key_id, Ed25519PrivateKey.from_private_bytes(read_key_file(path))


def load_shuffler_verifiers(keys_dir: Path) -> dict[str, Ed25519PublicKey]:
    """Every shuffler public key by id (from ``public/``): the analyzer accepts releases of any of them."""
    files = _keyed_files(KeysDir(Path(keys_dir)).public, "shuffler-", ".ed25519.pub", "shuffler public")
    out: dict[str, Ed25519PublicKey] = {}
    for key_id, path in files.items():
        try:
            out[key_id] = Ed25519PublicKey.from_public_bytes(read_key_file(path, private=False))
        except ValueError as err:
            if isinstance(err, KeyFileError):
                raise
            raise KeyFileError(f"{path}: not a valid Ed25519 public key") from None
    return out


def load_or_create_secret(path: Path) -> bytes:
    """The 32-byte secret at ``path``, created from OS entropy if absent.

    Race-safe: the new secret is written and fsynced to a temporary file first, then hard-linked to
    ``path``, which fails if another process got there first; the loser then reads the winner's key, so
    concurrent first runs always agree on one secret and nobody ever reads a partial file.
    """
    path = Path(path)
    if not path.exists():
        ensure_dir(path.parent)
        create_exclusive(path, os.urandom(SECRET_BYTES), mode=0o600)  # False: another process won; read its key
    return read_key_file(path, SECRET_BYTES)


def init_keys(keys_dir: Path) -> dict[str, object]:
    """Create whatever is missing (one analyzer key, one shuffler signing and one sealing key, PRF keys, fleet
    key, empty registry).

    Idempotent: existing keys are kept. Returns the current analyzer and shuffler key ids and the paths
    created by this call.
    """
    from .devices import DeviceRegistry  # devices imports files only; deferred to keep the module graph flat

    keys_dir = ensure_dir(Path(keys_dir))
    created: list[str] = []

    def has(directory: str, suffix: str) -> bool:
        d = keys_dir / directory
        return d.is_dir() and any(p.name.endswith(suffix) and KEY_ID_PATTERN.fullmatch(p.name[: -len(suffix)])
                                  for p in d.iterdir())

    if not has("analyzer", ".x25519"):
        created.append(f"analyzer/{generate_analyzer_key(keys_dir)}.x25519")
    if not has("shuffler", ".ed25519"):
        created.append(f"shuffler/{generate_shuffler_key(keys_dir)}.ed25519")
    if not has("shuffler", ".x25519"):
        created.append(f"shuffler/{generate_shuffler_sealing_key(keys_dir)}.x25519")
    for rel in ("shuffler/prf.key", "encoder/prf.key", "encoder/fleet.key"):
        existed = (keys_dir / rel).exists()
        load_or_create_secret(keys_dir / rel)
        if not existed:
            created.append(rel)
    registry = KeysDir(keys_dir).device_registry
    if not registry.exists():
        DeviceRegistry().save(registry)
        created.append("registry/devices.parquet")
    analyzer_id, _ = load_analyzer_public(keys_dir)
    shuffler_id, _ = load_shuffler_signer(keys_dir)
    sealing_id, _ = load_shuffler_sealing_public(keys_dir)
    return {"analyzer_key_id": analyzer_id, "shuffler_key_id": shuffler_id, "shuffler_sealing_key_id": sealing_id,
            "created": created}
