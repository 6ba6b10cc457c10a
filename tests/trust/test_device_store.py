"""The on-disk device store: lookups as the Parquet registry answers them, ordered changes, offsets kept with
the rows, read-only readers, and memory that stays bounded whatever the number of devices."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from transforms.trust.device_store import DeviceStore


def _id(n: int) -> str:
    return f"{n:032x}"


def test_changes_apply_in_order_with_their_offsets(tmp_path: Path) -> None:
    with DeviceStore(tmp_path / "s.sqlite") as store:
        a, b = b"a" * 32, b"b" * 32
        assert store.apply([(_id(1), a), (_id(2), b), (_id(1), None), (_id(1), a), (_id(2), b)],
                           topic="devices", offsets={0: 5}) == 2
        assert store.public_keys([_id(1), _id(2), _id(3), "xyz", 7, _id(1)]) == [a, b, None, None, None, a]
        assert store.apply([(_id(2), None), (_id(2), None), (_id(9), None)], topic="devices", offsets={0: 8}) == -1
        assert len(store) == 1 and store.offsets("devices") == {0: 8} and store.offsets("other") == {}
        with pytest.raises(ValueError):
            store.apply([("not an id", a)])
        with pytest.raises(ValueError):
            store.apply([(_id(4), b"short")])
        assert len(store) == 1  # a refused batch changes nothing
    with DeviceStore(tmp_path / "s.sqlite", readonly=True) as reader:  # reopened from disk
        assert reader.public_key(_id(1)) == a and _id(2) not in reader and len(reader) == 1
        with pytest.raises(PermissionError):
            reader.apply([(_id(5), a)])
    with pytest.raises(FileNotFoundError):
        DeviceStore(tmp_path / "none.sqlite", readonly=True)


_LOOKUP_ALL = textwrap.dedent("""
    import json, sys
    from transforms.trust.device_store import DeviceStore

    def rss(field):
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith(field)) / 1024

    store = DeviceStore(sys.argv[1], readonly=True, cache_kib=4096)
    ids = DeviceStore(sys.argv[1], readonly=True, cache_kib=256)._db  # a cursor over every id, in chunks
    store.public_keys(["00" * 16])
    base, found, last = rss("VmRSS:"), 0, b""
    while True:
        chunk = [r[0].hex() for r in ids.execute("SELECT id FROM devices WHERE id > ? ORDER BY id LIMIT 2000",
                                                 (last,))]
        if not chunk:
            break
        last = bytes.fromhex(chunk[-1])
        found += sum(k is not None for k in store.public_keys(chunk[::-1]))
    print(json.dumps({"found": found, "growth_mb": rss("VmHWM:") - base}))
""")


def test_memory_stays_bounded_while_every_device_is_looked_up(tmp_path: Path) -> None:
    """600,000 devices: 29 MB of ids and keys (34 MB as the Parquet registry holds them in memory). A process
    that looks every one of them up grows by its page cache (4 MiB here) and some interpreter slack, not by
    the registry's size; the bound 12 MiB is under half of the data."""
    n, path = 600_000, tmp_path / "big.sqlite"
    with DeviceStore(path) as store:
        for _ in range(n // 100_000):
            blob = os.urandom(48 * 100_000)
            store.apply((blob[48 * i:48 * i + 16].hex(), blob[48 * i + 16:48 * i + 48]) for i in range(100_000))
        assert len(store) == n
    done = subprocess.run([sys.executable, "-c", _LOOKUP_ALL, str(path)], capture_output=True, text=True,
                          timeout=1200, cwd=Path(__file__).resolve().parents[2], check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["found"] == n
    assert result["growth_mb"] < 12, result


def test_add_raw_enrols_arrays_in_one_transaction_as_apply_does(tmp_path: Path) -> None:
    """The legacy import's bulk path: raw id and key arrays, any order, an id given twice or already enrolled
    added once; the count and the lookups as ``apply`` leaves them."""
    import numpy as np

    rng = np.random.default_rng(3)
    ids = rng.integers(0, 256, (50, 16), dtype=np.uint8)
    keys = rng.integers(0, 256, (50, 32), dtype=np.uint8)
    with DeviceStore(tmp_path / "d.sqlite") as store:
        assert store.apply([(ids[0].tobytes().hex(), keys[0].tobytes())]) == 1
        assert store.add_raw(np.concatenate([ids, ids[:5]]), np.concatenate([keys, keys[:5]])) == 49
        assert len(store) == 50
        assert store.public_keys([i.tobytes().hex() for i in ids[::-1]]) == [k.tobytes() for k in keys[::-1]]
        with pytest.raises(ValueError, match="device ids for"):
            store.add_raw(ids, keys[:3])
