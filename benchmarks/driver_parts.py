"""The bounded shuffler's driver on one staged window: seconds and bytes read from staging per release.

Why: the driver reads every part of a release from the staging location (a local disk, or an object store where
every byte read is a request); a part is a sub-crowd's messages. Here the parts of one window are staged as the
pipeline stages them (``transforms.shuffler.release_step.part_stager``, one bundle) and ``seal_and_publish`` runs
on them with publishing replaced by a no-op, so only the driver's own work is timed: grouping, the withheld check,
signing and writing the release file. Bytes read are counted on every open of a staged part
file.

    python benchmarks/driver_parts.py --sets 300000 --subkeys 16 --payload 64

Measured on this 2-core machine (300,000 sets of one 64-byte message, 22.8 MB staged, shared with other
jobs; same keys, same release digest before and after). Before the staged index each load read the part's
whole batch file, five times per part (listing, release key, withheld check, two write passes): 16 parts in
3 files, 524 MB read (23x the staged bytes) in 67 opens, 1.33-1.43 s; 2 parts, 114 MB (5x), 1.32-1.35 s.
With it, the layout from the parts' headers and each part read once: 22.8 MB (1.00x) for 16, 2 or 1 parts
(19, 4, 2 opens), 1.25-1.6 s. The time is mostly Avro-encoding and signing the batches (about 1.2 of 2.2 s
under a profiler); the bytes are what an object-store staging location bills and makes the driver wait for.

``--blanket EPS`` (GRR, ``[crowd] blanket_epsilon``): the driver counts the real messages' key ids in a first
pass, then writes the release with its dummies, so every part but the first is read twice. 300,000 sets of
80-byte sealed messages in 16 parts, GRR d = 64 at eps 2, blanket eps 1 (14 dummies), load 3.4 on 2 cores:
1.83-2.50 s and 53.5 MB read (1.94x staged) against 1.25-1.46 s and 27.6 MB (1.00x) without the blanket.
"""

from __future__ import annotations

import argparse
import builtins
import hashlib
import io
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere


class _Counted:
    """A file handle that adds what it reads to ``counts``."""

    def __init__(self, handle: Any, counts: dict[str, int]):
        self._handle, self._counts = handle, counts

    def read(self, *size: int) -> bytes:
        data = self._handle.read(*size)
        self._counts["bytes"] += len(data)
        return data

    def __enter__(self) -> _Counted:
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._handle.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)


def blanket_spec(blanket: float) -> Any:
    """The example spec with GRR and ``[crowd] blanket_epsilon`` (OLH has no blanket)."""
    import tomllib

    from pipelines.examples import example_path
    from transforms.spec import spec_from_dict

    raw = tomllib.loads(example_path("app_language").read_text())
    raw["mechanism"] = {"name": "grr", "epsilon": raw["mechanism"]["epsilon"]}
    raw["crowd"]["blanket_epsilon"] = blanket
    return spec_from_dict(raw)


def measure(sets: int, subkeys: int, payload: int, keys: Path | None, blanket: float | None = None
            ) -> dict[str, Any]:
    from pipelines.enrolment import enrol_simulated
    from pipelines.examples import example_path
    from pipelines.job import BoundedRun
    from pipelines.job_config import JobConfig
    from pipelines.shuffle import seal_run
    from transforms.io.kafka.bounded import PartitionRange
    from transforms.shuffler import release_step as driver
    from transforms.shuffler.graph import ReleasePart
    from transforms.shuffler.packed import PackedMessages
    from transforms.spec import load_spec
    from transforms.state.ledger import ReleaseLedger
    from transforms.state.run_state import RunState

    spec = load_spec(example_path("app_language")) if blanket is None else blanket_spec(blanket)
    end = 1_800_000_000_000 // 3_600_000 * 3_600_000
    tmp = Path(tempfile.mkdtemp(prefix="driver-parts-"))
    config = JobConfig(bootstrap="127.0.0.1:1", specs=(spec,), out_dir=tmp / "out", state_dir=tmp / "state",
                       keys_dir=keys or tmp / "keys", shuffled_topic="unused")
    if keys is None or not (keys / "registry").exists():
        enrol_simulated(config.keys, ["c0"])
    staging = tmp / "staging"
    staging.mkdir()
    rng = np.random.default_rng(1)
    per = sets // subkeys
    header = b""
    if blanket is not None:  # messages shaped like sealed payloads (key id header, exact length) for the census
        from transforms.trust.keys import load_analyzer_public
        from transforms.trust.sealing import SEAL_OVERHEAD
        from transforms.wire.avro_payload import payload_pad_length

        key_id = load_analyzer_public(config.keys)[0]
        header = bytes((1, len(key_id))) + key_id.encode()
        payload = SEAL_OVERHEAD + len(key_id) + 2 + payload_pad_length(spec.randomizer)
    stager = driver.part_stager(str(staging))
    stager.start_bundle()
    for k in range(subkeys):
        body = np.frombuffer(rng.bytes(per * payload), np.uint8).reshape(per, payload).copy()
        body[:, :len(header)] = np.frombuffer(header, np.uint8)
        messages = PackedMessages(np.zeros(per, np.int32), np.arange(per + 1, dtype=np.int64) * payload,
                                  body.tobytes())
        stager.process(ReleasePart(spec.spec_id, None, end, k, messages, per, None))
    stager.finish_bundle()
    staged = sum(p.stat().st_size for p in staging.glob("part-*"))
    counts = {"bytes": 0, "opens": 0}
    real_open = io.open

    def counting_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        handle = real_open(path, *args, **kwargs)
        if str(path).startswith(str(staging)) and Path(path).name.startswith("part-"):
            counts["opens"] += 1
            return _Counted(handle, counts)
        return handle

    publish, driver.publish = driver.publish, lambda *a, **k: 0
    io.open = builtins.open = counting_open
    try:
        run = BoundedRun(config, "shuffle", "reports", RunState(), [PartitionRange("reports", 0, 0, sets)], "k1",
                         staging, end + 10)
        started = time.perf_counter()
        added: dict[str, int] = {}
        released, _ = seal_run(run, ReleaseLedger(config.state / "ledger"), added)
        seconds = time.perf_counter() - started
    finally:
        io.open = builtins.open = real_open
        driver.publish = publish
    (release,) = (config.state / "releases").glob("*.bin")
    return {"seconds": seconds, "staged": staged, "files": len(list(staging.glob("part-*"))), **counts,
            "released": released, "digest": hashlib.sha256(release.read_bytes()).hexdigest()[:16],
            "dummies": added.get("dummies", 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", type=int, default=300_000)
    parser.add_argument("--subkeys", type=int, default=16)
    parser.add_argument("--payload", type=int, default=64, help="bytes per sealed message (one per set)")
    parser.add_argument("--keys", type=Path, help="a keys directory to reuse (same keys: same release digest)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--blanket", type=float, help="GRR with [crowd] blanket_epsilon = this (dummies added)")
    args = parser.parse_args()
    for _ in range(args.repeat):
        r = measure(args.sets, args.subkeys, args.payload, args.keys, args.blanket)
        print(f"{args.sets:,} sets in {args.subkeys} parts: staged {r['staged'] / 1e6:.1f} MB in {r['files']} "
              f"file(s); driver {r['seconds']:.2f} s, read {r['bytes'] / 1e6:.1f} MB "
              f"({r['bytes'] / r['staged']:.2f}x staged) in {r['opens']} opens; {r['dummies']} dummies; release "
              f"digest {r['digest']}",
              flush=True)


if __name__ == "__main__":
    main()
