"""Peak memory per pending report and rate of the shuffle job alone, on reports encoded once.

Why apart from ``benchmarks/windows.py memory``: the shuffler is the job whose memory grows with the
window, and encoding a million reports takes minutes; here the reports topic of each size is encoded once
(``prepare``) on a broker that outlives the script, and the shuffle job is then run as often as needed
(``shuffle``), each time in its own process (``benchmarks/windows.py run_job``: VmHWM of the child), with a
fresh state directory and consumer group, so it reads the whole topic and drains its one window.

    esa broker --port 19092 &                                     # keep it running
    python benchmarks/shuffle_memory.py prepare --bootstrap 127.0.0.1:19092 --base /tmp/shufmem --clients 100000 300000
    python benchmarks/shuffle_memory.py shuffle --bootstrap 127.0.0.1:19092 --base /tmp/shufmem --clients 100000 300000

Printed per size: wall time and sets/s of the job, peak RSS in the pipeline and overall; then the growth
of the peak between the smallest and the largest size, in bytes per report (fixed costs cancel out).
Take sizes of 300,000 and more: below that the Kafka client's prefetch (capped at 32 MiB per partition) and
the sub-crowd size (capped by ``transforms.shuffler.plan.RECORDS_PER_SUBKEY``) still grow with n.

Measured on this 2-core machine (OLH, one window, n devices = n reports, shared with other jobs): peak RSS
345 / 460 / 539 / 791 MB at 100k / 300k / 1M / 3M, i.e. 118-132 B per report above 300k, at 8.1k / 9.2k /
9.5k / 7.6k sets/s; before the sets were packed and spilled: 426 / 752 / 1,842 MB at 100k / 300k / 1M
(1,634 B per report) at 6.9k / 8.1k / 8.5k sets/s.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere

from benchmarks.windows import JobRun, run_job


def _topics(n: int) -> dict[str, str]:
    return {"raw_topic": f"mem{n}-raw", "reports_topic": f"mem{n}-rep", "shuffled_topic": f"mem{n}-shuf"}


def prepare(bootstrap: str, base: Path, n: int) -> None:
    """Enrol ``n`` devices, produce their telemetry in one window and encode it (once per size)."""
    from pipelines.demo.population import synthesize
    from pipelines.demo.simulate import produce_population
    from pipelines.enrolment import enrol_simulated
    from pipelines.examples import example_path
    from transforms.spec import load_spec

    root = base / f"n{n}"
    if (root / "prepared.json").exists():
        return
    spec_path = example_path("app_language")
    spec = load_spec(spec_path)
    window_ms = spec.window_seconds * 1000
    now = int(time.time() * 1000)
    population = synthesize(spec, n, start_ms=(now // window_ms - 2) * window_ms, seed=n)
    enrol_simulated(root / "keys", population.client_ids.tolist())
    produce_population(bootstrap, spec, population, raw_topic=_topics(n)["raw_topic"],
                       reports_topic=_topics(n)["reports_topic"])
    fields = _fields(bootstrap, root, "encode", now, str(spec_path))
    encoded = run_job("encode", fields)
    print(f"n={n:,}: encoded in {encoded.seconds:.1f} s")
    (root / "prepared.json").write_text(json.dumps({"now_ms": now, "spec_path": str(spec_path)}))


def _fields(bootstrap: str, root: Path, stage: str, now_ms: int, spec_path: str, tag: str = "") -> dict:
    return {"bootstrap": bootstrap, "out_dir": str(root / "out"), "state_dir": str(root / "state" / f"{stage}{tag}"),
            "keys_dir": str(root / "keys"), "group_id": f"shufmem-{root.name}-{stage}{tag}", "drain": True,
            "now_ms": now_ms, "seed": 11, "spec_path": spec_path, **_topics(int(root.name[1:]))}


def shuffle(bootstrap: str, base: Path, n: int) -> JobRun:
    root = base / f"n{n}"
    prepared = json.loads((root / "prepared.json").read_text())
    tag = f"-{time.time_ns()}"
    return run_job("shuffle", _fields(bootstrap, root, "shuffle", prepared["now_ms"], prepared["spec_path"], tag))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["prepare", "shuffle"])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--clients", type=int, nargs="+", default=[100_000, 300_000])
    args = parser.parse_args()
    if args.what == "prepare":
        for n in args.clients:
            prepare(args.bootstrap, args.base, n)
        return
    points: list[tuple[int, float]] = []
    for n in args.clients:
        r = shuffle(args.bootstrap, args.base, n)
        counters = r.summary["counters"]
        read = counters.get("kafka_records_read", 0)
        print(f"n={n:>10,}: {r.seconds:6.1f} s wall ({r.summary['seconds']:.1f} s in run, "
              f"{read / r.summary['seconds']:,.0f} sets/s), peak RSS {r.peak_rss_mb:,.0f} MB "
              f"(pipeline {r.summary['peaks_mb'].get('pipeline', 0):,.0f}, start "
              f"{r.summary['peaks_mb']['start']:,.0f}), released {counters.get('sets_released', 0):,}, "
              f"balanced {r.summary['balanced']}", flush=True)
        points.append((n, r.peak_rss_mb))
    if len(points) > 1:
        (n0, m0), (n1, m1) = min(points), max(points)
        print(f"peak RSS growth {(m1 - m0) * 2**20 / (n1 - n0):,.0f} B per report")


if __name__ == "__main__":
    main()
