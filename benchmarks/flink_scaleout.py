"""Scale-out of the chain (encode -> shuffle -> analyze, ``esa run``) on a Flink 1.19.3 session cluster.

One run, side by side on one population: the in-process FnApiRunner, the FnApiRunner with
``--direct_running_mode multi_processing --direct_num_workers 2`` (SDK workers as subprocesses), and Flink at
parallelism 1 and 2 (``deploy/flink/local-cluster``: 1 JobManager + 2 TaskManagers of 2 slots; PROCESS
harnesses from ``deploy/flink/env``; the job server assembled from Maven, started by each ``esa run``). Every
command is the Beam 2.62.0 environment's ``esa``, so all four run the same Beam.

Wall seconds are the ``esa run`` command's, start to end (its job server's start-up included on Flink). CPU
seconds are everything the run burnt on this machine: the command and its reaped children (the job server
JVM and its watchdog, in-process SDK workers) from ``getrusage(RUSAGE_CHILDREN)``, plus the cluster's JVMs'
utime+stime and the reaped PROCESS harnesses' cutime+cstime from ``/proc/PID/stat`` of the JobManager and
TaskManagers this benchmark started, read before and after. The broker's CPU is not counted (the same for
every runner). Events are the raw TelemetryEvent records the encoder read.

    python benchmarks/flink_scaleout.py --clients 20000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere

from pipelines.broker import LocalBroker
from pipelines.demo.population import synthesize
from pipelines.demo.simulate import produce_population
from pipelines.enrolment import enrol_simulated
from pipelines.flink_cluster import LocalFlinkCluster
from pipelines.flink_env import ensure_env
from transforms.spec import load_spec

SPEC = """[analysis]\nname = "bench_olh"\nmetric = "bench_olh"\n[domain]\nsize = 16\n[mechanism]\nname = "olh"
epsilon = 3.0\n[window]\nsize_seconds = 3600\n[crowd]\nepsilon = 1.0\ndelta = 1e-6\n[privacy]\ndelta = 1e-6\n"""
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime + cutime + cstime of a live process (its reaped children included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / TICKS


def cluster_cpu(cluster: LocalFlinkCluster) -> float:
    return sum(cpu_seconds(pid) for pid in cluster.pids().values())


def esa_run(env: Path, args: list[str]) -> tuple[float, float, dict]:
    """(wall s, CPU s of the command and its reaped children, its JSON summary)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([str(env / "bin" / "esa"), "run", *args], capture_output=True, text=True, timeout=7200,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"esa run {' '.join(args[-6:])} failed: {done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=20_000)
    args = parser.parse_args()
    env = ensure_env()
    harness = json.dumps({"command": str(env / "bin" / "esa-sdk-harness")})
    with tempfile.TemporaryDirectory(prefix="esa-flink-bench-") as tmp, LocalBroker() as broker:
        base = Path(tmp)
        (base / "spec.toml").write_text(SPEC)
        spec = load_spec(base / "spec.toml")
        window_ms = spec.window_seconds * 1000
        start_ms = (int(time.time() * 1000) // window_ms - 4) * window_ms
        population = synthesize(spec, args.clients, windows=2, start_ms=start_ms, seed=5)
        enrol_simulated(base / "keys", population.client_ids.tolist())
        stem = f"bench-{int(time.time())}"
        produce_population(broker.bootstrap, spec, population, bad_per_kind=0, seed=5, raw_topic=f"{stem}-raw",
                           reports_topic=f"{stem}-bad")
        cluster = LocalFlinkCluster(base / "flink", rest_port=0, slots=2, taskmanagers=2)
        cluster.start()
        try:
            flink = ["--runner=FlinkRunner", f"--flink_master={cluster.rest}", "--environment_type=PROCESS",
                     f"--environment_config={harness}"]
            runners = {"in process (FnApiRunner)": [],
                       "FnApiRunner multi_processing, 2 workers": ["--direct_running_mode=multi_processing",
                                                                  "--direct_num_workers=2"],
                       "Flink, parallelism 1": [*flink, "--parallelism=1"],
                       "Flink, parallelism 2": [*flink, "--parallelism=2"]}
            results = []
            for i, (name, extra) in enumerate(runners.items()):
                flags = [f"--spec={base / 'spec.toml'}", f"--kafka_bootstrap={broker.bootstrap}",
                         f"--raw_topic={stem}-raw", f"--reports_topic={stem}-{i}-rep",
                         f"--shuffled_topic={stem}-{i}-shuf", f"--consumer_group={stem}-{i}",
                         f"--output_dir={base / str(i)}", f"--keys_dir={base / 'keys'}", "--drain", "--create_topics"]
                before, jobs = cluster_cpu(cluster), len(cluster.get("/jobs/overview")["jobs"])
                wall, cpu, summary = esa_run(env, [*flags, *extra])
                cpu += cluster_cpu(cluster) - before
                ran = len(cluster.get("/jobs/overview")["jobs"]) - jobs
                if ran != (3 if extra and "FlinkRunner" in extra[0] else 0):
                    raise SystemExit(f"{name}: {ran} jobs ran on the cluster")  # all three, or none
                events = summary["accounting"]["encode"]["read"]
                results.append((name, wall, cpu, events))
                print(f"{name}: {wall:.1f} s wall, {cpu:.1f} CPU s, {events} events", file=sys.stderr, flush=True)
        finally:
            cluster.stop()
    reference = results[0][1]
    print(f"| runner ({args.clients} clients, {results[0][3]} events) | wall s | x in-process | CPU s | "
          "CPU us/event |")
    print("|---|---:|---:|---:|---:|")
    for name, wall, cpu, events in results:
        print(f"| {name} | {wall:.1f} | {wall / reference:.2f} | {cpu:.1f} | {cpu / events * 1e6:.0f} |")
    print(f"\nload: {os.getloadavg()[0]:.1f} (1 min), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
