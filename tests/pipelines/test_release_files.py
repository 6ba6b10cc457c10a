"""The shuffler's release files: streamed, signed, cut exactly like ``split_into_batches``, read back whole."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from schemas import encode_record  # noqa: F401  (schemas before trust's encoders)
from transforms.shuffler.graph import ReleasePart
from transforms.shuffler.packed import PackedMessages
from transforms.shuffler.release_files import batch_bounds, file_digest, iter_batches, write_release
from transforms.trust.keys import init_keys, load_shuffler_signer, load_shuffler_verifiers
from transforms.trust.message_set import SealedMessage
from transforms.trust.release import decode_release_batch, release_id_of, split_into_batches, verify_release_batch

SPEC = "app_language@0123456789ab"
END = 1_800_000_000_000


def test_batch_bounds_cut_exactly_where_split_into_batches_does() -> None:
    rng = np.random.default_rng(5)
    for trial in range(40):
        n = int(rng.integers(0, 2500))
        big = 200_000 if trial % 4 == 0 else 2500  # some messages over the budget: they travel alone
        messages = [(int(rng.integers(-1, 300)), bytes(int(rng.integers(0, big)))) for _ in range(n)]
        max_bytes = int(rng.integers(20_000, 600_000))
        expected = [len(c) for c in split_into_batches([SealedMessage(c, s) for c, s in messages], max_bytes)]
        assert [b - a for a, b in batch_bounds(PackedMessages.of(messages), max_bytes)] == expected, trial
    with pytest.raises(ValueError, match="max_bytes"):
        batch_bounds(PackedMessages.of([]), 100)


def test_a_release_streams_to_its_file_and_reads_back_signed_and_whole(tmp_path: Path) -> None:
    init_keys(tmp_path / "keys")
    key_id, signer = load_shuffler_signer(tmp_path / "keys")
    rng = np.random.default_rng(9)
    parts = [ReleasePart(SPEC, None, END, subkey, PackedMessages.of(
        [(0, rng.bytes(100)) for _ in range(4000)]), 3900, 100) for subkey in range(3)]
    written = write_release(tmp_path / "releases", parts, key_id, signer)
    assert not written.path.exists() and written.temp.exists()  # nothing in place before commit
    written.commit()
    assert written.path.exists() and not written.temp.exists()
    assert written.release_id == release_id_of(SPEC, None, END) and written.digest == file_digest(written.path)
    batches = [decode_release_batch(b) for b in iter_batches(written.path)]
    verifiers = load_shuffler_verifiers(tmp_path / "keys")
    for i, batch in enumerate(batches):
        verify_release_batch(batch, verifiers)
        assert (batch.batch_index, batch.batch_count, batch.n_sets, batch.n_messages, batch.deleted) == (
            i, len(batches), 3 * 3900, 12_000, 300)
    assert len(batches) == written.batches > 1
    sent = [(m.channel, m.sealed) for b in batches for m in b.messages]
    assert sent == [m for p in parts for m in p.messages]  # every message, in sub-key then release order
    again = write_release(tmp_path / "releases", parts, key_id, signer)
    assert again.digest == written.digest  # Ed25519 is deterministic: a rerun reproduces the identical file
    again.discard()
    assert not again.temp.exists() and written.path.exists()


def test_a_truncated_release_file_is_an_error(tmp_path: Path) -> None:
    init_keys(tmp_path / "keys")
    parts = [ReleasePart(SPEC, "v1", END, 0, ((0, b"x" * 50), (1, b"y" * 50)), 2, None)]
    written = write_release(tmp_path / "releases", parts, *load_shuffler_signer(tmp_path / "keys"))
    written.commit()
    data = written.path.read_bytes()
    for cut in (2, len(data) - 1):
        written.path.write_bytes(data[:cut])
        with pytest.raises(ValueError, match="ends inside"):
            list(iter_batches(written.path))
    with pytest.raises(ValueError, match="one release"):
        write_release(tmp_path / "releases", [*parts, parts[0]._replace(crowd_id="v2")], "k", None)
