"""The keys directory: layout, permissions, rotation, refusals, and race-safe secret creation."""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import stat
from pathlib import Path

import pytest

from transforms.trust import (
    KeyFileError,
    generate_analyzer_key,
    generate_shuffler_key,
    init_keys,
    load_analyzer_private,
    load_analyzer_public,
    load_or_create_secret,
    load_shuffler_signer,
    load_shuffler_verifiers,
)
from transforms.trust.keys import new_key_id


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_init_creates_the_layout_with_private_files_owner_only(tmp_path: Path) -> None:
    info = init_keys(tmp_path)
    a, s, x = info["analyzer_key_id"], info["shuffler_key_id"], info["shuffler_sealing_key_id"]
    private = [f"analyzer/{a}.x25519", f"shuffler/{s}.ed25519", f"shuffler/{x}.x25519", "shuffler/prf.key",
               "encoder/prf.key", "encoder/fleet.key", "registry/devices.parquet"]
    public = [f"public/analyzer-{a}.x25519.pub", f"public/shuffler-{s}.ed25519.pub",
              f"public/shuffler-{x}.x25519.pub"]
    assert sorted(info["created"]) == sorted(private)
    for rel in private:
        assert mode_of(tmp_path / rel) == 0o600, rel
    for rel in [*private[:6], *public]:
        assert (tmp_path / rel).stat().st_size == 32, rel
    for rel in public:
        assert mode_of(tmp_path / rel) & 0o044 == 0o044, rel  # readable by anyone
    assert not list(tmp_path.rglob(".tmp-*"))  # atomic writes leave no temporaries behind


def test_init_is_idempotent(tmp_path: Path) -> None:
    first = init_keys(tmp_path)
    secrets_before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    second = init_keys(tmp_path)
    assert second["created"] == []
    assert (second["analyzer_key_id"], second["shuffler_key_id"]) == (first["analyzer_key_id"],
                                                                      first["shuffler_key_id"])
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == secrets_before


def test_key_ids_are_dated_random_and_sort_by_date() -> None:
    ids = {new_key_id() for _ in range(50)}
    assert len(ids) == 50
    assert all(re.fullmatch(r"\d{8}-[0-9a-f]{8}", i) for i in ids)
    from datetime import UTC, datetime
    assert new_key_id(datetime(2025, 1, 2, tzinfo=UTC)) < new_key_id(datetime(2025, 1, 3, tzinfo=UTC))


def test_rotation_keeps_every_private_key_and_publishes_the_newest(tmp_path: Path) -> None:
    init_keys(tmp_path)
    old_id, _ = load_analyzer_public(tmp_path)
    # A key made on a later day sorts last: rename the new one to a future date to simulate rotation.
    new_id = generate_analyzer_key(tmp_path)
    later = "29991231-" + new_id.split("-")[1]
    (tmp_path / "analyzer" / f"{new_id}.x25519").rename(tmp_path / "analyzer" / f"{later}.x25519")
    (tmp_path / "public" / f"analyzer-{new_id}.x25519.pub").rename(tmp_path / "public" / f"analyzer-{later}.x25519.pub")
    newest, public = load_analyzer_public(tmp_path)
    assert newest == later
    private = load_analyzer_private(tmp_path)
    assert set(private) == {old_id, later}
    assert private[later].public_key().public_bytes_raw() == public.public_bytes_raw()

    s_old, _ = load_shuffler_signer(tmp_path)
    s_new = generate_shuffler_key(tmp_path)
    verifiers = load_shuffler_verifiers(tmp_path)
    assert set(verifiers) == {s_old, s_new}
    s_id, signer = load_shuffler_signer(tmp_path)
    assert s_id == s_new  # same day: the key written last is the newest
    assert signer.public_key().public_bytes_raw() == verifiers[s_id].public_bytes_raw()


def test_refuses_a_private_key_readable_by_others(tmp_path: Path) -> None:
    info = init_keys(tmp_path)
    path = tmp_path / "analyzer" / f"{info['analyzer_key_id']}.x25519"
    path.chmod(0o644)
    with pytest.raises(KeyFileError, match="chmod 600") as err:
        load_analyzer_private(tmp_path)
    assert str(path) in str(err.value)
    (tmp_path / "shuffler" / "prf.key").chmod(0o640)
    with pytest.raises(KeyFileError, match=r"prf\.key.*chmod 600"):
        load_or_create_secret(tmp_path / "shuffler" / "prf.key")


def test_refuses_a_key_of_the_wrong_size(tmp_path: Path) -> None:
    info = init_keys(tmp_path)
    path = tmp_path / "shuffler" / f"{info['shuffler_key_id']}.ed25519"
    path.write_bytes(b"\x00" * 31)
    with pytest.raises(KeyFileError, match=r"expected 32 raw bytes, found 31") as err:
        load_shuffler_signer(tmp_path)
    assert path.name in str(err.value)


def test_refuses_a_missing_directory_or_no_keys(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="analyzer private directory is missing"):
        load_analyzer_private(tmp_path)
    (tmp_path / "public").mkdir()
    with pytest.raises(KeyFileError, match="no shuffler public keys"):
        load_shuffler_verifiers(tmp_path)


def _create(path: str, barrier: mp.synchronize.Barrier, out: mp.Queue) -> None:
    barrier.wait()
    out.put(load_or_create_secret(Path(path)))


def test_concurrent_creation_agrees_on_one_secret(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")  # never fork: the test process may hold Beam's threads (a forked child can hang)
    for attempt in range(3):
        path = tmp_path / f"race{attempt}" / "prf.key"
        barrier, out = ctx.Barrier(4), ctx.Queue()
        procs = [ctx.Process(target=_create, args=(str(path), barrier, out)) for _ in range(4)]
        for p in procs:
            p.start()
        results = [out.get(timeout=30) for _ in procs]
        for p in procs:
            p.join(timeout=30)
            assert p.exitcode == 0
        assert len(set(results)) == 1
        assert results[0] == path.read_bytes() and len(results[0]) == 32
        assert not list(path.parent.glob(".tmp-*"))


def test_secrets_are_fresh_entropy(tmp_path: Path) -> None:
    a = load_or_create_secret(tmp_path / "a.key")
    b = load_or_create_secret(tmp_path / "b.key")
    assert a != b and load_or_create_secret(tmp_path / "a.key") == a


def test_command_line_init_rotate_enroll_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from transforms.trust.__main__ import main

    keys = tmp_path / "keys"
    assert main(["init", str(keys)]) == 0
    first = json.loads(capsys.readouterr().out)["analyzer_key_id"]
    assert main(["rotate", "analyzer", str(keys)]) == 0
    second = json.loads(capsys.readouterr().out)["key_id"]
    public = [Ed25519PrivateKey.generate().public_key().public_bytes_raw() for _ in range(3)]
    listing = tmp_path / "devices.txt"
    listing.write_text("# fleet\n" + "\n".join(k.hex() for k in public) + "\n" + public[0].hex() + "\n")
    assert main(["enroll", str(keys), str(listing), "--legacy_registry"]) == 0
    assert json.loads(capsys.readouterr().out) == {"read": 4, "added": 3, "enrolled": 3}
    assert main(["show", str(keys)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["analyzer_private"] == sorted([first, second]) and shown["enrolled_devices"] == 3
    listing.write_text("zz\n")
    assert main(["enroll", str(keys), str(listing), "--legacy_registry"]) == 2
    assert "devices.txt:1: not a hex public key" in capsys.readouterr().err
