"""Cost per distinct window and memory per pending report of the split jobs, each job a child process.

Two experiments on an embedded broker (each job runs in its own process, which reports its own peak RSS,
``VmHWM``: at the start, over the Beam pipeline, and over the driver's work after it, measured apart by
resetting the high-water mark when the pipeline ends):

* ``windows``: ``--windows`` authenticated one-set windows (enrolled devices sending one set per hourly
  window, as the adversarial window flood does) through the shuffle job and the analyze job with
  ``--drain``; every crowd is a single device, so every window is withheld. Prints wall time per job and
  per window, and peak RSS.
* ``memory``: ``--clients`` (e.g. 50000 200000) devices in one window of ``examples/app_language.toml``
  (OLH, one message per device) through encode, shuffle and analyze; prints each job's peak RSS and the
  growth per report between the smallest and the largest population (the slope, so the interpreter,
  Beam and the libraries' fixed cost cancel out).

    python benchmarks/windows.py windows --windows 20000
    python benchmarks/windows.py memory --clients 50000 200000
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
HOUR_MS = 3_600_000


@dataclass
class JobRun:
    """One job run in a child process: its wall time, peak RSS and the run summary it printed."""

    stage: str
    seconds: float
    peak_rss_mb: float
    summary: dict[str, Any]


def _config(fields: dict[str, Any]) -> Any:
    from pipelines.job_config import JobConfig
    from transforms.spec import load_spec, spec_from_dict

    fields = dict(fields)
    spec = load_spec(Path(fields.pop("spec_path"))) if "spec_path" in fields else spec_from_dict(
        fields.pop("spec_dict"), source="benchmark")
    for name in ("out_dir", "state_dir", "keys_dir"):
        fields[name] = Path(fields[name])
    return JobConfig(specs=(spec,), **fields)


def peak_rss_mb() -> float:
    """This process's own high-water RSS (VmHWM). Not ``ru_maxrss``: Linux carries the parent's peak into a
    child across fork and exec, which would floor every job at the benchmark driver's size."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def reset_peak_rss() -> float:
    """Reset VmHWM to the current RSS (``/proc/self/clear_refs``, Linux >= 4.0); returns the current RSS."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")
    return peak_rss_mb()


def _child(stage: str, fields_json: str) -> None:
    """Run one job (in the child process) and print its summary as one JSON line."""
    config = _config(json.loads(fields_json))
    job = importlib.import_module(f"pipelines.{stage}")
    marks: dict[str, float] = {"start": peak_rss_mb()}
    inner = job.run_pipeline

    def run_pipeline(*args: Any, **kwargs: Any) -> Any:  # the peak so far when the Beam pipeline ends
        try:
            return inner(*args, **kwargs)
        finally:
            marks["pipeline"] = peak_rss_mb()
            marks["driver_base"] = reset_peak_rss()  # from here on VmHWM is the driver's (seal, publish) peak


    job.run_pipeline = run_pipeline
    summary = job.run(config)
    if "driver_base" in marks:  # what the driver added on top of what the pipeline left resident
        marks["driver"] = peak_rss_mb() - marks["driver_base"]
    marks["end"] = max(marks["start"], marks.get("pipeline", 0.0), marks.get("driver_base", 0.0) + marks.get(
        "driver", 0.0))
    print(json.dumps({"counters": summary.counters, "seconds": summary.seconds, "accounting": summary.accounting,
                      "balanced": summary.balanced, "peaks_mb": marks,
                      "extra": {k: v for k, v in summary.extra.items() if isinstance(v, int | str)}}))


def run_job(stage: str, fields: dict[str, Any]) -> JobRun:
    """Run ``stage`` in a child process, which reports its own peak RSS (see ``peak_rss_mb``)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "_job", stage, json.dumps(fields)], env=env, cwd=REPO,
                          capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{stage} job failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
    return JobRun(stage, seconds, summary["peaks_mb"]["end"], summary)


def _fields(bootstrap: str, base: Path, stage: str, now_ms: int, topics: dict[str, str], **extra: Any) -> dict:
    return {"bootstrap": bootstrap, "out_dir": str(base / "out"), "state_dir": str(base / "state" / stage),
            "keys_dir": str(base / "keys"), "group_id": f"bench-{base.name}-{stage}", "drain": True,
            "now_ms": now_ms, **topics, **extra}


def windows_experiment(bootstrap: str, base: Path, n_windows: int, n_devices: int) -> list[JobRun]:
    """``n_windows`` one-set windows through shuffle and analyze (all withheld: one device per crowd)."""
    from pipelines.enrolment import enrol_simulated
    from schemas import encode_record  # noqa: F401  (schemas before trust's encoders)
    from transforms.io.kafka.bounded import ensure_topics, produce_records
    from transforms.trust.devices import SimulatedFleet
    from transforms.trust.envelope import seal_envelope
    from transforms.trust.keys import load_shuffler_sealing_public
    from transforms.trust.message_set import MessageSet, SealedMessage, encode_message_set, sign_message_set

    spec_dict = {"analysis": {"name": "windows", "metric": "windows"}, "domain": {"size": 8},
                 "mechanism": {"name": "grr", "epsilon": 2.0}, "window": {"size_seconds": 3600},
                 "crowd": {"epsilon": 1.0, "delta": 1e-6, "min_clients": 10}}
    spec = _config({"spec_dict": spec_dict, "bootstrap": "", "out_dir": ".", "state_dir": ".",
                    "keys_dir": "."}).specs[0]
    now = (int(time.time() * 1000) // HOUR_MS) * HOUR_MS
    tag = base.name
    topics = {"reports_topic": f"{tag}-rep", "shuffled_topic": f"{tag}-shuf", "raw_topic": f"{tag}-raw"}
    ensure_topics(bootstrap, list(topics.values()), partitions=2)
    clients = [f"flooder-{i:05d}" for i in range(n_devices)]
    enrol_simulated(base / "keys", clients)
    fleet = SimulatedFleet.from_keys_dir(base / "keys")
    devices = [fleet.device_id(c) for c in clients]
    x_id, x_pub = load_shuffler_sealing_public(base / "keys")
    records = []
    for w in range(n_windows):
        i = w % n_devices
        ms = MessageSet(spec.spec_id, None, devices[i], now - (w + 2) * HOUR_MS + 17, os.urandom(16),
                        "20260101-00000000", (SealedMessage(0, os.urandom(60)),))
        encoded = encode_message_set(sign_message_set(ms, fleet.signing_key(clients[i])))
        records.append((devices[i].encode(), seal_envelope(x_pub, x_id, encoded)))
    produce_records(bootstrap, topics["reports_topic"], records)
    extra = {"spec_dict": spec_dict, "max_age_seconds": (n_windows + 10) * 3600, "seed": 7}
    return [run_job(stage, _fields(bootstrap, base, stage, now, topics, **extra)) for stage in ("shuffle", "analyze")]


def memory_experiment(bootstrap: str, base: Path, n: int) -> list[JobRun]:
    """``n`` devices in one window of the app_language spec (OLH) through encode, shuffle and analyze."""
    from pipelines.demo.population import synthesize
    from pipelines.demo.simulate import produce_population
    from pipelines.enrolment import enrol_simulated
    from pipelines.examples import example_path
    from transforms.spec import load_spec

    spec_path = example_path("app_language")
    spec = load_spec(spec_path)
    window_ms = spec.window_seconds * 1000
    now = int(time.time() * 1000)
    start = (now // window_ms - 2) * window_ms
    population = synthesize(spec, n, start_ms=start, seed=n)
    enrol_simulated(base / "keys", population.client_ids.tolist())
    tag = base.name
    topics = {"raw_topic": f"{tag}-raw", "reports_topic": f"{tag}-rep", "shuffled_topic": f"{tag}-shuf"}
    produce_population(bootstrap, spec, population, raw_topic=topics["raw_topic"],
                       reports_topic=topics["reports_topic"])
    extra = {"spec_path": str(spec_path), "seed": 11}
    return [run_job(stage, _fields(bootstrap, base, stage, now, topics, **extra))
            for stage in ("encode", "shuffle", "analyze")]


def _print_runs(label: str, runs: list[JobRun], per: int, unit: str) -> None:
    for r in runs:
        read = r.summary["counters"].get("kafka_records_read", 0)
        print(f"{label:>18} {r.stage:>8}: {r.seconds:7.1f} s wall ({r.summary['seconds']:6.1f} s in run), "
              f"{1e3 * r.seconds / per:7.3f} ms per {unit}, peak RSS {r.peak_rss_mb:7.1f} MB "
              f"(at start {r.summary['peaks_mb']['start']:.0f}, in the pipeline "
              f"{r.summary['peaks_mb'].get('pipeline', 0):.0f}, added by the driver after it "
              f"{r.summary['peaks_mb'].get('driver', 0):.1f}), read {read}, "
              f"balanced {r.summary['balanced']}, {r.summary['extra']}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="experiment", required=True)
    win = sub.add_parser("windows")
    win.add_argument("--windows", type=int, default=20_000)
    win.add_argument("--devices", type=int, default=100)
    mem = sub.add_parser("memory")
    mem.add_argument("--clients", type=int, nargs="+", default=[50_000, 200_000])
    args = parser.parse_args(argv)
    from pipelines.broker import LocalBroker

    with LocalBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        if args.experiment == "windows":
            runs = windows_experiment(broker.bootstrap, Path(tmp) / "win", args.windows, args.devices)
            _print_runs(f"{args.windows} windows", runs, args.windows, "window")
            return
        peaks: dict[tuple[str, str], list[tuple[int, float]]] = {}
        for n in args.clients:
            runs = memory_experiment(broker.bootstrap, Path(tmp) / f"mem{n}", n)
            _print_runs(f"{n} clients", runs, n, "client")
            for r in runs:
                for phase in ("pipeline", "driver", "end"):
                    peaks.setdefault((r.stage, phase), []).append((n, r.summary["peaks_mb"].get(phase, 0.0)))
        if len(args.clients) > 1:
            for (stage, phase), points in peaks.items():
                (n0, m0), (n1, m1) = min(points), max(points)
                print(f"{stage:>8} {phase:>8}: peak RSS growth {(m1 - m0) * 2**20 / (n1 - n0):7.0f} B per report "
                      f"({m0:.0f} MB at {n0}, {m1:.0f} MB at {n1})")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_job":
        _child(sys.argv[2], sys.argv[3])
    else:
        main()
