"""Cost of the shuffler's admission per message set: ``IngressFn.process`` on batches of signed sets.

Why: the shuffle job is bound by ingress's Python work on the main thread (decoding, the registry lookup,
the signed bytes, packing), not by Ed25519 verification, which runs GIL-free on a thread pool. This builds
``--n`` signed single-message sets from a simulated fleet of ``--devices`` devices whose registry is saved
to and loaded from Parquet (as the shuffle job loads it), then feeds them to ``IngressFn`` in batches of
``--batch`` records (the Kafka reader's element size) with ``--crypto_threads`` verification threads, and
prints, median of ``--repeats`` runs (each set sealed whole to the shuffler, as devices send them: the outer
layer is opened with its X25519 on the same pool): the main thread's CPU time per set (``time.thread_time``:
what the pool cannot take over), the wall time per set and the garbage collector's share of it.

    .venv/bin/python benchmarks/ingress.py                      # ~1 minute
    .venv/bin/python benchmarks/ingress.py --crypto_threads 1 2 --n 20000
    .venv/bin/python benchmarks/ingress.py --reread             # every set verified by an earlier run
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere

from pipelines.enrolment import enrol_simulated, registry_path
from transforms.device.wire import EventRows, ShufflerKey, signed_message_sets
from transforms.io.kafka.bounded import KafkaRecord
from transforms.shuffler.elements import VERIFIED, TimePolicy
from transforms.shuffler.ingress import IngressFn
from transforms.spec import AnalysisSpec, spec_from_dict
from transforms.state.prior_runs import PriorRuns
from transforms.state.verified_sets import VerifiedSets
from transforms.trust.devices import SimulatedFleet
from transforms.trust.keys import load_analyzer_public, load_shuffler_sealing_public

WINDOW_MS = 3_600_000
NOW_MS = 1_800_000 * WINDOW_MS
TOPIC = "reports"


def grr_spec(size: int = 64) -> AnalysisSpec:
    return spec_from_dict({
        "analysis": {"name": "ingress_bench"}, "domain": {"size": size},
        "mechanism": {"name": "grr", "epsilon": 1.0},
        "window": {"size_seconds": WINDOW_MS // 1000, "allowed_lateness_seconds": 0},
        "crowd": {"epsilon": 1.0, "delta": 1e-6, "subkeys": 4, "min_clients": 10},
        "clients": {"max_reports_per_window": 1000},
    })


def signed_records(keys: Path, spec: AnalysisSpec, n: int, devices: int, partitions: int, windows: int = 1
                   ) -> list[KafkaRecord]:
    """``n`` signed sets of ``devices`` enrolled simulated devices, their event times in the last ``windows``
    closed windows, as Kafka records spread over partitions."""
    clients = [f"dev-{i}" for i in range(devices)]
    enrol_simulated(keys, clients)
    fleet = SimulatedFleet.from_keys_dir(keys)
    fleet.prepare(clients)
    key_id, analyzer = load_analyzer_public(keys)
    rng = np.random.default_rng(1)  # a benchmark's inputs: reproducible
    first = NOW_MS - (windows + 1) * WINDOW_MS  # NOW_MS is a window boundary: the last closed windows
    events = [EventRows(spec, [(int(rng.integers(spec.d)),)], first + int(rng.integers(windows * WINDOW_MS)), None,
                        fleet.device_id(clients[i % devices]), fleet.signing_key(clients[i % devices]),
                        rng.bytes(16)) for i in range(n)]
    shuffler = ShufflerKey(*load_shuffler_sealing_public(keys))
    values = signed_message_sets(events, analyzer, key_id, shuffler, threads=2)
    return [KafkaRecord(TOPIC, i % partitions, i // partitions, NOW_MS, None, v) for i, v in enumerate(values)]


class GcClock:
    """Wall time spent in the garbage collector (a full collection of a large heap can cost more than a batch's
    work: a pass that hits one is slower for a reason that is not ingress's code)."""

    def __init__(self) -> None:
        self.seconds, self._start = 0.0, 0.0
        gc.callbacks.append(self._tick)

    def _tick(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start


def run_once(fn: IngressFn, batches: list[list[KafkaRecord]], clock: GcClock) -> tuple[float, float, float, int]:
    """(main-thread CPU seconds, wall seconds, GC seconds, keyed outputs) of one pass over ``batches``."""
    keyed = 0
    gc0, cpu0, wall0 = clock.seconds, time.thread_time(), time.perf_counter()
    for batch in batches:
        for out in fn.process(batch):
            keyed += isinstance(out, tuple)  # keyed packs; tagged outputs are TaggedOutput objects
    return time.thread_time() - cpu0, time.perf_counter() - wall0, clock.seconds - gc0, keyed


def verified_before(fn: IngressFn, batches: list[list[KafkaRecord]]) -> VerifiedSets:
    """What a first run verified, as the next run receives it."""
    entries = [out.value for batch in batches for out in fn.process(batch)
               if getattr(out, "tag", None) == VERIFIED]
    return VerifiedSets().merged([(p, o, np.frombuffer(d, np.uint8)) for p, o, d in entries], {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000, help="signed sets")
    parser.add_argument("--devices", type=int, default=10_000, help="enrolled devices sending them")
    parser.add_argument("--batch", type=int, default=2_000, help="records per IngressFn element")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--windows", type=int, default=1, help="windows the event times spread over")
    parser.add_argument("--crypto_threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--reread", action="store_true", help="sets verified by an earlier run (no signatures)")
    args = parser.parse_args()
    spec = grr_spec()
    with tempfile.TemporaryDirectory() as tmp:
        keys = Path(tmp) / "keys"
        t0 = time.perf_counter()
        records = signed_records(keys, spec, args.n, args.devices, args.partitions, args.windows)
        batches = [records[i:i + args.batch] for i in range(0, len(records), args.batch)]
        times = TimePolicy(NOW_MS, 30 * 86_400_000, 3_600_000)
        registry = str(registry_path(keys))
        prior = PriorRuns()
        if args.reread:
            first = IngressFn([spec], registry, prior, times, 1, keys_dir=str(keys))
            first.setup()
            prior = PriorRuns(verified=verified_before(first, batches))
        print(f"{args.n:,} sets of {args.devices:,} enrolled devices in {args.windows} window(s), batches of "
              f"{args.batch}, "
              f"{'re-read (verified before)' if args.reread else 'first read'}; built in "
              f"{time.perf_counter() - t0:.1f} s; load average {os.getloadavg()[0]:.1f}")
        clock = GcClock()
        for threads in args.crypto_threads:
            fn = IngressFn([spec], registry, prior, times, threads, keys_dir=str(keys))
            fn.setup()
            run_once(fn, batches[:1], clock)  # warm: the pool, the schema cache, the registry
            runs = [run_once(fn, batches, clock) for _ in range(args.repeats)]
            cpu, wall, in_gc = (statistics.median(r[k] for r in runs) / args.n * 1e6 for k in range(3))
            print(f"crypto_threads {threads}: main thread {cpu:6.1f} us/set, wall {wall:6.1f} us/set "
                  f"({1e6 / wall:,.0f} sets/s), in GC {in_gc:4.1f} us/set; median of {args.repeats}; "
                  f"keyed outputs {sorted({r[3] for r in runs})}")


if __name__ == "__main__":
    main()
