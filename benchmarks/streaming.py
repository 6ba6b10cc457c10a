"""Continuous mode over a simulated day: 24 one-hour windows, out-of-order and late reports, released once each.

Drives the three jobs (encode -> shuffle -> analyze) the way ``esa run --follow`` does -- one bounded run
after another -- but on a SIMULATED clock: every step produces the reports that "arrived" in the next
``--step-minutes`` of simulated time and then runs each job once with ``JobConfig.now_ms`` pinned to the
end of that step, so windows close exactly when the event-time watermark passes them. Each job runs in its
own long-lived process (its trust domain), so the peak RSS printed is the job's own.

Traffic: every device reports once per window at a uniform time in it; ``--out-of-order`` of the reports
arrive up to ``--max-delay-minutes`` after their event time, ``--late`` arrive after their window was
released (beyond the allowed lateness: they must be dead-lettered as late). Telemetry goes on in the 25th
hour so the watermark can pass the 24th window; that window is still open (held) when the run stops.

Latency is measured from a window's *close* (window end + allowed lateness: the first moment the watermark
may pass it) to its published estimates: in simulated time (steps) and in wall time (start of the chain
pass that released it to its estimates part on disk).

    python benchmarks/streaming.py                      # 24 x 1,000 devices, 20-minute steps (~80 runs per job)
    python benchmarks/streaming.py --step-minutes 10 --devices-per-window 5000
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import resource
import statistics
import tempfile
import time
import tomllib
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

HOUR_MS = 3_600_000
MINUTE_MS = 60_000
EXAMPLE_SPEC = Path(__file__).resolve().parents[1] / "examples" / "app_language.toml"
STAGES = ("encode", "shuffle", "analyze")
TAIL = 3  # windows of telemetry after the last measured one: the watermark must pass it (they may close too)


def streaming_spec(lateness_s: int) -> Any:
    """examples/app_language.toml with 1 h windows and a short allowed lateness."""
    from transforms.spec import spec_from_dict

    raw = tomllib.loads(EXAMPLE_SPEC.read_text())
    raw["window"] = {"size_seconds": 3600, "allowed_lateness_seconds": lateness_s}
    return spec_from_dict(raw, str(EXAMPLE_SPEC))


@dataclass(frozen=True)
class Traffic:
    """One report per (device, window): event time, arrival time, value, and its kind (0 on time,
    1 out of order, 2 late). Windows from ``hours`` on are the tail that keeps the watermark moving."""

    device: np.ndarray
    window: np.ndarray
    event_ms: np.ndarray
    arrival_ms: np.ndarray
    value: np.ndarray
    kind: np.ndarray


def draw_traffic(spec: Any, start_ms: int, hours: int, devices: int, out_of_order: float, max_delay_ms: int,
                 late: float, late_after_ms: int, late_spread_ms: int, seed: int) -> Traffic:
    """Draw hours + TAIL windows of reports (the last ones only as a tail); simulation randomness, seeded."""
    from pipelines.demo.population import Law, histogram_values

    rng = np.random.default_rng(seed)
    n = (hours + TAIL) * devices
    device = np.tile(np.arange(devices), hours + TAIL)
    window = np.repeat(np.arange(hours + TAIL), devices)
    event = start_ms + window * HOUR_MS + rng.integers(0, HOUR_MS, size=n)
    kind = np.zeros(n, dtype=np.int8)
    u = rng.random(n)
    kind[(u >= late) & (u < late + out_of_order)] = 1
    kind[(u < late) & (window < hours)] = 2  # the tail may not close before the end: no late reports there
    arrival = event.copy()
    ooo = kind == 1
    arrival[ooo] += rng.integers(1, max_delay_ms + 1, size=int(ooo.sum()))
    lat = kind == 2
    window_end = start_ms + (window[lat] + 1) * HOUR_MS
    arrival[lat] = window_end + late_after_ms + rng.integers(0, late_spread_ms, size=int(lat.sum()))
    value = histogram_values(spec, n, rng, Law())
    return Traffic(device, window, event, arrival, value, kind)


def telemetry(spec: Any, traffic: Traffic, mask: np.ndarray) -> list[tuple[bytes, bytes]]:
    """The TelemetryEvents of ``mask``, in order of arrival (key = device id)."""
    from schemas import SCHEMA_VERSION, encode_record

    idx = np.flatnonzero(mask)
    idx = idx[np.argsort(traffic.arrival_ms[idx], kind="stable")]
    out = []
    for i in idx.tolist():
        cid = device_id(int(traffic.device[i]))
        record = {"schema_version": SCHEMA_VERSION, "client_id": cid, "event_time": int(traffic.event_ms[i]),
                  "metric": spec.metric, "value": spec.categories[int(traffic.value[i])], "crowd_id": None}
        out.append((cid.encode(), encode_record("TelemetryEvent", record, check=False)))
    return out


def device_id(i: int) -> str:
    return f"device-{i:07d}"


def quiet_logs() -> None:
    """Warnings only; kafka-python logs every reconnect of its short-lived clients as an ERROR."""
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kafka").setLevel(logging.CRITICAL)


def job_worker(stage: str, config: Any, conn: Any) -> None:
    """One job's process: run the stage once per ``now_ms`` received; reply with its figures and peak RSS."""
    import importlib

    quiet_logs()
    job = importlib.import_module(f"pipelines.{stage}")
    while True:
        now_ms = conn.recv()
        if now_ms is None:
            break
        started = time.time()
        summary = job.run(replace(config.for_stage(stage), now_ms=now_ms))
        conn.send({"started": started, "seconds": summary.seconds, "counters": summary.counters,
                   "parts": summary.parts, "balanced": summary.balanced,
                   "max_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss})
    conn.close()


class Jobs:
    """The three jobs, each in its own spawned process, run in order once per step."""

    def __init__(self, config: Any):
        ctx = mp.get_context("spawn")
        self._pipes, self._procs = {}, {}
        for stage in STAGES:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=job_worker, args=(stage, config, child), name=f"esa-{stage}", daemon=True)
            proc.start()
            self._pipes[stage], self._procs[stage] = parent, proc

    def step(self, now_ms: int) -> dict[str, dict[str, Any]]:
        out = {}
        for stage in STAGES:
            self._pipes[stage].send(now_ms)
            out[stage] = self._pipes[stage].recv()
        return out

    def close(self) -> None:
        for stage in STAGES:
            self._pipes[stage].send(None)
            self._procs[stage].join(60)


def broker_peak_rss_kb(pid: int | None) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def shuffled_keys(bootstrap: str, topic: str) -> Counter:
    """How many times each ``release_id:index`` key is on the shuffled topic (each must be exactly once)."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=3000, group_id=None)
    try:
        return Counter(record.key.decode() for record in consumer)
    finally:
        consumer.close()


def simulate(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from pipelines.broker import LocalBroker
    from pipelines.enrolment import enrol_simulated
    from pipelines.job_config import JobConfig
    from transforms.io.kafka.bounded import ensure_topics, produce_records
    from transforms.state.estimates_store import part_path  # noqa: F401  (layout documented there)

    spec = streaming_spec(args.lateness_minutes * 60)
    step_ms = args.step_minutes * MINUTE_MS
    ooo_ms = args.out_of_orderness_minutes * MINUTE_MS
    lateness_ms = spec.allowed_lateness_seconds * 1000
    # A late report arrives after its window has certainly been released: close + out-of-orderness + 2 steps.
    late_after_ms = lateness_ms + ooo_ms + 2 * step_ms
    start_ms = (int(time.time() * 1000) // HOUR_MS - args.hours - 2) * HOUR_MS
    traffic = draw_traffic(spec, start_ms, args.hours, args.devices_per_window, args.out_of_order,
                           args.max_delay_minutes * MINUTE_MS, args.late, late_after_ms, step_ms, args.seed)
    end_ms = start_ms + args.hours * HOUR_MS + late_after_ms + step_ms
    end_ms = -(-end_ms // step_ms) * step_ms
    windows = {start_ms + (w + 1) * HOUR_MS for w in range(args.hours)}
    with LocalBroker() as broker:
        config = JobConfig(bootstrap=broker.bootstrap, specs=(spec,), out_dir=out, raw_topic="telemetry",
                           reports_topic="reports", shuffled_topic="shuffled", group_id="esa-streaming",
                           out_of_orderness_seconds=ooo_ms // 1000, idle_timeout_seconds=args.idle_timeout_minutes * 60)
        ensure_topics(broker.bootstrap, ["telemetry", "reports", "shuffled"], partitions=3)
        enrol_simulated(config.keys, [device_id(i) for i in range(args.devices_per_window)])
        jobs = Jobs(config)
        runs: list[dict[str, Any]] = []
        seen: dict[int, dict[str, Any]] = {}
        produced = 0
        try:
            now = start_ms
            while now < end_ms:
                now += step_ms
                batch = telemetry(spec, traffic, (traffic.arrival_ms > now - step_ms) & (traffic.arrival_ms <= now))
                t0 = time.perf_counter()
                produced += produce_records(broker.bootstrap, "telemetry", batch)
                produce_s = time.perf_counter() - t0
                figures = jobs.step(now)
                figures["produced"], figures["produce_s"], figures["now"] = len(batch), produce_s, now
                runs.append(figures)
                for part in (out / "estimates" / f"spec={spec.name}").glob("window_end_ms=*/part-*.parquet"):
                    end = int(part.parent.name.split("=")[1])
                    if end not in seen:
                        seen[end] = {"now": now, "wall_s": part.stat().st_mtime - figures["encode"]["started"]}
                if args.progress:
                    print(f"  t+{(now - start_ms) / HOUR_MS:5.2f} h: produced {len(batch):5d}, windows released "
                          f"{len(seen):2d}, pass {sum(figures[s]['seconds'] for s in STAGES):5.1f} s", flush=True)
        finally:
            jobs.close()
        keys = shuffled_keys(broker.bootstrap, "shuffled")
        broker_rss = broker_peak_rss_kb(broker.pid)
    return {"spec": spec, "traffic": traffic, "runs": runs, "seen": seen, "windows": windows, "keys": keys,
            "produced": produced, "start_ms": start_ms, "end_ms": end_ms, "lateness_ms": lateness_ms,
            "broker_rss_kb": broker_rss, "config": config}


def audit(result: dict[str, Any], out: Path) -> dict[str, Any]:
    """Exactly-once checks: per window one shuffler ledger entry, one analyst ledger entry, one estimates
    part and one copy of each release batch on the shuffled topic; late reports dead-lettered as late."""
    import fastavro

    from pipelines.job_config import default_state_dir
    from transforms.state.ledger import ReleaseLedger

    spec, traffic, windows, runs = result["spec"], result["traffic"], result["windows"], result["runs"]
    state = default_state_dir(out)
    shuffle_ledger = Counter(e.key.window_end_ms for e in ReleaseLedger(state / "shuffle/ledger").entries(
        spec.spec_id) if e.published)
    analyst_entries = list(ReleaseLedger(state / "analyze/ledger").entries(spec.spec_id))
    analyst_ledger = Counter(e.key.window_end_ms for e in analyst_entries if e.published)
    parts = Counter(int(p.parent.name.split("=")[1]) for p in
                    (out / "estimates" / f"spec={spec.name}").glob("window_end_ms=*/part-*.parquet"))
    releases = Counter(key.split(":")[0] for key in result["keys"])
    once = [w for w in sorted(windows) if shuffle_ledger[w] == analyst_ledger[w] == parts[w] == 1]
    tail = sorted((set(shuffle_ledger) | set(analyst_ledger) | set(parts)) - windows)
    letters = [r for f in sorted((state / "shuffle/dead_letters").glob("*.avro"))
               for r in fastavro.reader(f.open("rb"))]
    reasons = Counter(str(r.get("reason", "")).split(":")[0] for r in letters)
    closed = np.isin(start_window_ends(result), sorted(windows | set(tail)))
    total = {s: Counter() for s in STAGES}
    for run in runs:
        for s in STAGES:
            total[s].update(run[s]["counters"])
    return {
        "windows_once": len(once), "windows": len(windows),
        "tail_released": len(tail),
        "tail_not_once": sum(not shuffle_ledger[w] == analyst_ledger[w] == parts[w] == 1 for w in tail),
        "batch_copies_max": max(result["keys"].values(), default=0), "releases_on_topic": len(releases),
        "late_sent": int((traffic.kind == 2).sum()), "late_dead_lettered": reasons.get("late", 0),
        "late_counter": total["shuffle"]["sets_late"],
        "dead_letters_other": sum(reasons.values()) - reasons.get("late", 0),
        "encode_dead": total["encode"]["dead_lettered"],
        "out_of_order_sent": int(((traffic.kind == 1) & (traffic.arrival_ms <= result["end_ms"])).sum()),
        "sets_expected": int((closed & (traffic.kind != 2) & (traffic.arrival_ms <= result["end_ms"])).sum()),
        "sets_released_or_deleted": total["shuffle"]["sets_released"] + total["shuffle"]["sets_deleted"],
        "sets_analyzed": sum(e.n_sets for e in analyst_entries),
        "sets_released": total["shuffle"]["sets_released"],
        "held_at_end": runs[-1]["shuffle"]["parts"].get("held", 0) if runs else 0,
        "unbalanced_runs": sum(not run[s]["balanced"] for run in runs for s in STAGES),
    }


def start_window_ends(result: dict[str, Any]) -> np.ndarray:
    """Window end of every drawn report."""
    return result["start_ms"] + (result["traffic"].window + 1) * HOUR_MS


def rate(runs: list[dict[str, Any]], stage: str, count: Any) -> tuple[float, float, float]:
    """(median records/s, median s per run, max s per run) over the runs that read something."""
    busy = [r[stage] for r in runs if r[stage]["counters"].get("kafka_records_read", 0) > 0]
    if not busy:
        return 0.0, 0.0, 0.0
    seconds = [b["seconds"] for b in busy]
    return (statistics.median(count(b) / b["seconds"] for b in busy), statistics.median(seconds), max(seconds))


def report(args: argparse.Namespace, result: dict[str, Any], checks: dict[str, Any], wall_s: float) -> None:
    runs, seen, lateness_ms = result["runs"], result["seen"], result["lateness_ms"]
    sim_lat = [(seen[w]["now"] - (w + lateness_ms)) / MINUTE_MS for w in sorted(result["windows"]) if w in seen]
    wall_lat = [seen[w]["wall_s"] for w in sorted(result["windows"]) if w in seen]
    read = lambda b: b["counters"].get("kafka_records_read", 0)  # noqa: E731
    new_sets = {id(r["shuffle"]): r["encode"]["counters"].get("events_encoded", 0) for r in runs}
    reads = sum(read(r["shuffle"]) for r in runs)
    passes = [sum(r[s]["seconds"] for s in STAGES) for r in runs]
    releasing = [r["analyze"] for r in runs if r["analyze"]["counters"].get("batches_analyzed", 0) > 0]
    print(f"\nstreaming benchmark: {args.hours} windows x {args.devices_per_window:,} devices, 1 h windows, allowed "
          f"lateness {args.lateness_minutes} min, out-of-orderness {args.out_of_orderness_minutes} min, "
          f"{args.step_minutes}-min steps ({len(runs)} runs of each job), {result['produced']:,} events, "
          f"{args.out_of_order:.0%} out of order by <= {args.max_delay_minutes} min, {args.late:.0%} late")
    rows = [
        ("windows released exactly once", f"{checks['windows_once']}/{checks['windows']}"
         f" (ledgers + estimates parts; releases on topic {checks['releases_on_topic']}, max copies of a batch "
         f"{checks['batch_copies_max']}; tail windows also released {checks['tail_released']}, not once "
         f"{checks['tail_not_once']})"),
        ("late reports dead-lettered as late", f"{checks['late_dead_lettered']}/{checks['late_sent']} "
         f"(counter {checks['late_counter']}; other dead letters {checks['dead_letters_other']}, encode "
         f"{checks['encode_dead']})"),
        ("out-of-order reports accepted", f"{checks['out_of_order_sent']:,} (none dead-lettered)"
         if checks["dead_letters_other"] == 0 else f"{checks['out_of_order_sent']:,} sent"),
        ("sets released + deleted / expected", f"{checks['sets_released_or_deleted']:,}/{checks['sets_expected']:,}"
         f" (analyzed {checks['sets_analyzed']:,} = released {checks['sets_released']:,}); held in the open "
         f"window at the end {checks['held_at_end']:,}"),
        ("runs with unbalanced accounting", f"{checks['unbalanced_runs']}"),
        ("encode records/s (median run)", "{:,.0f} (run {:.1f} s median, {:.1f} s max)".format(
            *rate(runs, "encode", read))),
        ("shuffle records/s read (median run)", "{:,.0f} (run {:.1f} s median, {:.1f} s max)".format(
            *rate(runs, "shuffle", read))),
        ("shuffle new sets/s (median run)", "{:,.0f}; re-read factor {:.1f} (held open-window sets)".format(
            rate(runs, "shuffle", lambda b: new_sets[id(b)])[0], reads / max(result["produced"], 1))),
        ("analyze messages/s (median busy run)", "{:,.0f} (run {:.1f} s median, {:.1f} s max)".format(
            *rate(runs, "analyze", lambda b: b["counters"].get("messages_analyzed", 0)))),
        ("analyze s per releasing run (first 3 / last 3)", " / ".join(
            ", ".join(f"{b['seconds']:.1f}" for b in part) for part in (releasing[:3], releasing[-3:]))
         + " (the odometer recomposes every window released so far)"),
        ("chain pass wall s (median / max)", f"{statistics.median(passes):.1f} / {max(passes):.1f}"),
        ("latency from close, simulated min", f"median {statistics.median(sim_lat):.0f}, min {min(sim_lat):.0f}, "
         f"max {max(sim_lat):.0f} (out-of-orderness {args.out_of_orderness_minutes} + step rounding)"
         if sim_lat else "no window released"),
        ("latency from close, wall s", f"median {statistics.median(wall_lat):.1f}, max {max(wall_lat):.1f} (chain "
         "pass start -> estimates part on disk)" if wall_lat else "no window released"),
        ("peak RSS MiB (encode/shuffle/analyze)", " / ".join(
            f"{max(r[s]['max_rss_kb'] for r in runs) / 1024:.0f}" for s in STAGES)
         + f"; broker {result['broker_rss_kb'] / 1024:.0f}" if result["broker_rss_kb"] else ""),
        ("benchmark wall time", f"{wall_s / 60:.1f} min"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices-per-window", type=int, default=1000)
    parser.add_argument("--hours", type=int, default=24, help="windows to release (1 h each)")
    parser.add_argument("--step-minutes", type=int, default=20, help="simulated time between two bounded runs")
    parser.add_argument("--lateness-minutes", type=int, default=5, help="allowed lateness of the spec")
    parser.add_argument("--out-of-orderness-minutes", type=int, default=10, help="watermark slack of the shuffler")
    parser.add_argument("--idle-timeout-minutes", type=int, default=5, help="as the jobs' default")
    parser.add_argument("--out-of-order", type=float, default=0.05)
    parser.add_argument("--max-delay-minutes", type=int, default=10)
    parser.add_argument("--late", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=2026, help="simulation seed (traffic only; job keys are fresh)")
    parser.add_argument("--keep", type=Path, help="keep the output directory here")
    parser.add_argument("--progress", action="store_true")
    args = parser.parse_args()
    if args.devices_per_window < 50 or args.hours < 1 or args.step_minutes < 1:
        parser.error("need >= 50 devices per window, >= 1 hour and >= 1-minute steps")
    quiet_logs()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="esa-streaming-") as tmp:
        out = args.keep or Path(tmp)
        result = simulate(args, out)
        checks = audit(result, out)
        if args.keep:
            (out / "runs.json").write_text(json.dumps({"runs": result["runs"], "checks": checks}, indent=1))
    report(args, result, checks, time.perf_counter() - started)
    ok = (checks["windows_once"] == checks["windows"] and not checks["tail_not_once"]
          and checks["late_dead_lettered"] == checks["late_sent"] and checks["unbalanced_runs"] == 0
          and checks["sets_released_or_deleted"] == checks["sets_expected"])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
