"""The device registry at scale: 10^7 enrolled devices in the shuffler's store (``pipelines.registry``).

On a local Apache Kafka (started here), each phase in its own process so that its peak memory is its own:

1. ``produce``: ``--devices`` enrolment records to a compacted devices topic (not timed as a registry figure);
2. ``catch-up``: the shuffler's catch-up from an empty store, topic -> store: enrolments per second, peak RSS;
3. ``startup``: a shuffler starting with the store already built (nothing new on the topic): the catch-up
   (open, offsets, probe the topic, count) and the workers' read-only open plus a first batch of lookups;
4. ``increment``: ``--increment`` new enrolments caught up on top of the full store (enrolments at scale);
5. ``lookups``: batched lookups as ingress does (``--batch`` ids per call, 10% of them unknown devices);
6. with ``--legacy``: the Parquet registry of the same size, loaded whole (``DeviceRegistry.load``) and
   rewritten (``save``, what each enrolment batch cost), for comparison.

Keys are random 32-byte strings, not Ed25519 points: the store never verifies a key (the shuffler's signature
check does, per set), and the catch-up checks every record's id against its key's hash, as for real keys.
Wall and CPU seconds are reported beside each other; ``uptime`` is printed before and after.

    .venv/bin/python benchmarks/registry_scale.py                      # 10^7 devices: ~30+ min on 2 loaded cores
    .venv/bin/python benchmarks/registry_scale.py --devices 200000     # quick
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere

import numpy as np

from transforms.trust.devices import device_id_of
from transforms.trust.enrolment import ENROLMENT_MAGIC, ENROLMENT_VERSION

CHUNK = 100_000
HEADER = ENROLMENT_MAGIC + bytes([ENROLMENT_VERSION])


def chunk_keys(seed: int, index: int) -> bytes:
    """The 32-byte keys of chunk ``index`` (CHUNK of them), regenerable on their own for lookups."""
    return np.random.default_rng([seed, index]).bytes(32 * CHUNK)


def records(n: int, seed: int, first_chunk: int = 0) -> Iterator[tuple[bytes, bytes]]:
    for index in range(first_chunk, first_chunk + (n + CHUNK - 1) // CHUNK):
        keys = chunk_keys(seed, index)
        for i in range(min(CHUNK, n - (index - first_chunk) * CHUNK)):
            key = keys[32 * i:32 * i + 32]
            yield device_id_of(key).encode("ascii"), HEADER + key


def _usage(started: float, cpu0: float) -> dict[str, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"wall_s": round(time.perf_counter() - started, 2),
            "cpu_s": round(usage.ru_utime + usage.ru_stime - cpu0, 2), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1)}


def _rss_mb() -> float:
    """This process's resident memory now (the baseline a phase starts from: Python, numpy, Beam's imports)."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def phase(args: argparse.Namespace) -> dict[str, Any]:
    """One phase, in this process (the parent runs each as a child)."""
    from pipelines.registry import catch_up, store_path

    state = Path(args.state)
    t0, c0 = time.perf_counter(), _cpu()
    if args.phase == "produce":
        from transforms.io.kafka.bounded import produce_records
        from transforms.io.kafka.devices import ensure_devices_topic

        ensure_devices_topic(args.bootstrap, args.topic)
        n = produce_records(args.bootstrap, args.topic, records(args.count, args.seed, args.first_chunk),
                            progress_every=100_000)
        return {"records": n, **_usage(t0, c0)}
    if args.phase in ("catch-up", "increment"):
        done = catch_up(state, bootstrap=args.bootstrap, topic=args.topic, legacy_registry=None)
        out = _usage(t0, c0)
        return {**done.as_dict(), **out, "per_s": round(done.read / out["wall_s"]),
                "per_cpu_s": round(done.read / max(out["cpu_s"], 1e-9))}
    if args.phase == "startup":
        from transforms.trust.device_store import DeviceStore

        done = catch_up(state, bootstrap=args.bootstrap, topic=args.topic, legacy_registry=None)
        caught = _usage(t0, c0)
        store = DeviceStore(store_path(state), readonly=True)
        keys = chunk_keys(args.seed, 0)
        ids = [device_id_of(keys[32 * i:32 * i + 32]) for i in range(args.batch)]
        found = sum(k is not None for k in store.public_keys(ids))
        return {"read": done.read, "devices": done.devices, "catch_up": caught, "ready": _usage(t0, c0),
                "first_batch_found": found}
    if args.phase == "lookups":
        from transforms.trust.device_store import DeviceStore

        rng = random.Random(args.seed)
        chunks = max(1, args.devices // CHUNK)
        ids: list[str] = []
        while len(ids) < args.lookups:
            keys = chunk_keys(args.seed, rng.randrange(chunks))
            ids.extend(device_id_of(keys[32 * i:32 * i + 32]) for i in rng.sample(range(CHUNK), 2_000))
        ids = ids[:args.lookups]
        for k in range(0, len(ids), 10):  # one in ten: a device never enrolled
            ids[k] = os.urandom(16).hex()
        rng.shuffle(ids)
        store = DeviceStore(store_path(state), readonly=True)
        t0, c0 = time.perf_counter(), _cpu()
        found = 0
        for start in range(0, len(ids), args.batch):
            found += sum(k is not None for k in store.public_keys(ids[start:start + args.batch]))
        out = _usage(t0, c0)
        return {"lookups": len(ids), "found": found, **out, "per_s": round(len(ids) / out["wall_s"]),
                "per_cpu_s": round(len(ids) / max(out["cpu_s"], 1e-9))}
    if args.phase == "legacy":
        return legacy(args)
    if args.phase == "bulk":
        return bulk(args)
    raise SystemExit(f"unknown phase {args.phase}")


def bulk(args: argparse.Namespace) -> dict[str, Any]:
    """The store of ``--devices`` devices built straight, in device-id order (B-tree appends), without Kafka:
    what a full catch-up would leave, in a fraction of its time (the builder's memory is not the shuffler's)."""
    import hashlib

    from pipelines.registry import store_path
    from transforms.trust.device_store import DeviceStore
    from transforms.trust.devices import DEVICE_ID_TAG

    chunks = (args.devices + CHUNK - 1) // CHUNK
    ids = np.empty((chunks * CHUNK, 16), np.uint8)
    keys = np.empty((chunks * CHUNK, 32), np.uint8)
    for index in range(chunks):
        raw = chunk_keys(args.seed, index)
        keys[index * CHUNK:(index + 1) * CHUNK] = np.frombuffer(raw, np.uint8).reshape(CHUNK, 32)
        ids[index * CHUNK:(index + 1) * CHUNK] = np.frombuffer(b"".join(
            hashlib.sha256(DEVICE_ID_TAG + raw[32 * i:32 * i + 32]).digest()[:16] for i in range(CHUNK)),
            np.uint8).reshape(CHUNK, 16)
    n = args.devices
    order = np.argsort(ids[:n].view("S16").ravel(), kind="stable")
    t0, c0 = time.perf_counter(), _cpu()
    with DeviceStore(store_path(Path(args.state))) as store:
        for start in range(0, n, 1_000_000):
            rows = order[start:start + 1_000_000]
            store.apply(zip([r.hex() for r in map(bytes, ids[rows])], map(bytes, keys[rows]), strict=True))
        count = len(store)
    return {"devices": count, "insert": _usage(t0, c0)}


def legacy(args: argparse.Namespace) -> dict[str, Any]:
    """The Parquet registry of the same size: written straight with pyarrow, then loaded and saved as before."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from transforms.trust.devices import _REGISTRY_SCHEMA, DeviceRegistry

    path = Path(args.state) / "devices.parquet"
    writer = pq.ParquetWriter(path, _REGISTRY_SCHEMA)
    for index in range((args.devices + CHUNK - 1) // CHUNK):
        keys = chunk_keys(args.seed, index)
        m = min(CHUNK, args.devices - index * CHUNK)
        rows = [keys[32 * i:32 * i + 32] for i in range(m)]
        writer.write_table(pa.table({"device_id": pa.array([device_id_of(k) for k in rows], pa.string()),
                                     "public_key": pa.array(rows, pa.binary(32)),
                                     "enrolled_at_ms": pa.array(np.zeros(m, np.int64))}, schema=_REGISTRY_SCHEMA))
    writer.close()
    t0, c0 = time.perf_counter(), _cpu()
    registry = DeviceRegistry.load(path)
    loaded = _usage(t0, c0)
    t1, c1 = time.perf_counter(), _cpu()
    registry.save(path)
    saved = _usage(t1, c1)
    return {"devices": len(registry), "load": loaded, "save": saved, "file_mb": round(path.stat().st_size / 2**20, 1)}


def child(args: argparse.Namespace, name: str, **extra: Any) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--phase", name, "--state", args.state, "--bootstrap", args.bootstrap,
            "--topic", args.topic, "--devices", str(args.devices), "--seed", str(args.seed),
            "--batch", str(args.batch), "--lookups", str(args.lookups)]
    for key, value in extra.items():
        argv += [f"--{key}", str(value)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"phase {name} failed:\n{done.stderr[-4000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{name}: {json.dumps(result)}", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=10_000_000)
    parser.add_argument("--increment", type=int, default=100_000)
    parser.add_argument("--lookups", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=2_000, help="ids per lookup call (ingress: one input batch)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--legacy", action="store_true", help="also load and save the Parquet registry")
    parser.add_argument("--bulk", action="store_true",
                        help="build the store straight in id order instead of catching up the whole topic (which "
                             "took hours of wall time at 10^7 on a loaded 2-core machine); the increment still "
                             "goes through the topic")
    parser.add_argument("--phase", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--state", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--topic", default="devices-bench", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--first_chunk", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        import pipelines.registry  # noqa: F401  (the shuffler's imports, Beam's among them: in the baseline)

        base = _rss_mb()
        print(json.dumps({**phase(args), "base_rss_mb": base}))
        return
    from pipelines.broker import LocalBroker

    print("uptime:", os.popen("uptime").read().strip(), "| date:", time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    with tempfile.TemporaryDirectory(prefix="registry-scale-") as tmp:
        broker = LocalBroker(data_dir=Path(tmp) / "broker").start()
        try:
            args.bootstrap, args.state = broker.bootstrap, str(Path(tmp) / "state")
            first_new = (args.devices + CHUNK - 1) // CHUNK + 1  # chunks never used by the first records
            if args.bulk:  # the store built straight; the topic holds only the increment
                child(args, "bulk")
            else:
                child(args, "produce", count=args.devices)
                child(args, "catch-up")
                child(args, "startup")
            child(args, "produce", count=args.increment, first_chunk=first_new)
            child(args, "increment")
            child(args, "startup")
            child(args, "lookups")
            store = Path(args.state) / "registry" / "devices.sqlite"
            print(f"store: {store.stat().st_size / 2**20:.0f} MiB on disk for {args.devices + args.increment} devices")
            if args.legacy:
                child(args, "legacy")
        finally:
            broker.stop()
    print("uptime:", os.popen("uptime").read().strip())


if __name__ == "__main__":
    main()
