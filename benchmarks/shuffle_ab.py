"""The shuffle job of two source trees, side by side on the same encoded reports: CPU per set against the floor.

Why: CPU seconds per record are robust to the machine's load, but still move a few percent with it; two trees
measured in one invocation, alternating on the same input topic, give a ratio both sides paid under the same
load. One broker and one encoded population (the encode job runs once, from the first tree); then, per repeat,
each tree's shuffle job runs in a fresh process of that tree (``benchmarks/stage_process.py``), with its own
output directory and consumer group, so every run reads the whole topic from the start.

    python benchmarks/shuffle_ab.py --clients 100000 --repeats 3 --trees /path/to/before .
    python benchmarks/shuffle_ab.py --clients 20000 --profile /tmp/prof   # each run under py-spy (GIL-holding)

The shuffler's device store (``STATE/registry/devices.sqlite``) is kept between runs by default (``--registry
kept``): the enrolled devices are imported into it once, before the runs (that import's CPU is printed apart),
and each shuffle run starts from a copy of it, as a production shuffler starts every run from the state
directory it keeps (``pipelines.registry``: the legacy file is imported once per version of it, the devices
topic read from where the last run stopped). ``--registry fresh``: every run imports every device again, as
``benchmarks/pipeline.py`` does (3-4 µs of CPU per device, counted in the run's CPU per set).

Printed per run and as medians: CPU µs per set (the job's threads and reaped workers), the single-threaded floor
(``benchmarks/crypto_ceiling.py``: open the envelope + verify the signature), floor / CPU, wall seconds, peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

CHILD = "child"


def _config(tree: Path, params: dict) -> object:
    from benchmarks.pipeline import bench_spec
    from pipelines.job_config import JobConfig

    return JobConfig(bootstrap=params["bootstrap"], specs=(bench_spec(params["mechanism"]),),
                     out_dir=Path(params["out"]), keys_dir=Path(params["keys"]), group_id=params["group"],
                     drain=True, raw_topic=params["raw"], reports_topic=params["reports"],
                     shuffled_topic=params["shuffled"], **params.get("config", {}))


def child(tree: Path, params: dict) -> None:
    """In a process of ``tree``: run one stage, print its StageResult as JSON."""
    sys.path.insert(0, str(tree))
    os.chdir(tree)
    from benchmarks.stage_process import run_stage

    if params.get("registry") and params["stage"] == "shuffle":  # the kept device store (see the module doc)
        from pipelines.registry import store_path

        store = store_path(_config(tree, params).for_stage("shuffle").state)
        store.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(params["registry"], store)

    threads = _sample_threads() if os.environ.get("SHUFFLE_AB_THREADS") else None
    if os.environ.get("SHUFFLE_AB_PHASES") or threads:  # the job in this process, no spawn
        if os.environ.get("SHUFFLE_AB_PHASES"):  # CPU seconds of the job's phases, to stderr
            _time_phases(params["stage"])
        from benchmarks.stage_process import _child

        result = _child(params["stage"], _config(tree, params), params.get("beam_args", []))
    else:
        result = run_stage(params["stage"], _config(tree, params), params.get("beam_args", []))
    if threads:
        threads()
    print(json.dumps({"seconds": result.seconds, "records": result.records, "messages": result.messages,
                      "rss": result.peak_rss_mb, "cpu": result.cpu_seconds}))


def _sample_threads() -> Callable[[], None]:
    """Sample this process's threads every 0.2 s (exited ones keep their last sample); the returned call prints
    each thread's user and system CPU seconds and context switches to stderr, as ``thread`` lines."""
    import threading

    tick = os.sysconf("SC_CLK_TCK")
    seen: dict[str, tuple[str, float, float, int, int]] = {}
    stop = threading.Event()

    def sample() -> None:
        for task in Path("/proc/self/task").iterdir():
            try:
                stat = (task / "stat").read_text()
                status = dict(line.split(":\t", 1) for line in (task / "status").read_text().splitlines()
                              if ":\t" in line)
            except OSError:
                continue
            comm, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
            seen[task.name] = (comm, int(fields[11]) / tick, int(fields[12]) / tick,
                               int(status["voluntary_ctxt_switches"]), int(status["nonvoluntary_ctxt_switches"]))

    def loop() -> None:
        while not stop.wait(0.2):
            sample()

    threading.Thread(target=loop, daemon=True, name="ab-sampler").start()

    def report() -> None:
        stop.set()
        sample()
        for tid, (comm, user, system, vol, invol) in sorted(seen.items(), key=lambda kv: -kv[1][1] - kv[1][2]):
            if user + system >= 0.05:
                print(f"thread {comm:<16} {tid:>7} user {user:6.2f} s  sys {system:5.2f} s  "
                      f"switches {vol:>8} voluntary {invol:>7} forced", file=sys.stderr, flush=True)
        print(f"thread load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
    return report


def _time_phases(stage: str) -> None:
    """Wrap the job module's steps so each prints the process CPU seconds it took (all threads)."""
    import importlib
    import time as clock

    module = importlib.import_module(f"pipelines.{stage}")
    for name in ("plan_run", "catch_up_job", "run_pipeline", "seal_run", "finish_run", "keep_dead_letters",
                 "republish_unpublished", "load_staged"):
        fn = getattr(module, name, None)
        if fn is None:
            continue

        def timed(*a, _fn=fn, _name=name, **k):
            started = clock.process_time()
            try:
                return _fn(*a, **k)
            finally:
                print(f"phase {_name}: {clock.process_time() - started:.3f} s CPU", file=sys.stderr, flush=True)

        setattr(module, name, timed)


@contextmanager
def busy_loops(n: int) -> Iterator[None]:
    """``n`` processes spinning in Python for the duration of the block: load the machine on purpose."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def run_in(tree: Path, params: dict, profile: str | None = None, gil_only: bool = True) -> dict:
    python = tree / ".venv" / "bin" / "python"
    python = python if python.exists() else Path(sys.executable)
    env = dict(os.environ, PYTHONPATH=str(tree))
    command = [str(python), str(Path(__file__).resolve()), CHILD, str(tree), json.dumps(params)]
    if profile:  # py-spy beside this interpreter: the job's process and its workers, raw stacks
        spy = Path(sys.executable).with_name("py-spy")
        command = [str(spy), "record", "--subprocesses", *(["--gil"] if gil_only else []), "--rate", "500",
                   "--format", "raw", "-o", profile, "--", *command]
    done = subprocess.run(command,
                          env=env, cwd=tree, check=True, capture_output=True, text=True)
    for line in done.stderr.splitlines():
        if line.startswith(("phase ", "thread ")):
            print("   ", line)
    return json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--mechanism", default="olh")
    parser.add_argument("--trees", nargs="+", default=["."],
                        help="source trees, each with its own .venv; TREE@SETTINGS sets JobConfig fields for that "
                             "tree's runs, e.g. .@crypto_threads=1")
    parser.add_argument("--stages", nargs="+", default=["shuffle"], choices=["shuffle", "analyze"])
    parser.add_argument("--beam_args", default="")
    parser.add_argument("--profile", help="a directory: each run under py-spy, its raw profile written there")
    parser.add_argument("--profile_threads", choices=["gil", "all"], default="gil",
                        help="gil: only the GIL-holding thread is sampled; all: every thread on a CPU")
    parser.add_argument("--registry", choices=["kept", "fresh"], default="kept",
                        help="kept: each shuffle run starts from a device store the devices were imported into "
                             "once (as a production shuffler's kept state); fresh: every run imports them again")
    parser.add_argument("--stress", type=int, default=0, metavar="N",
                        help="run every tree twice per repeat: as is, and beside N busy-looping processes this "
                             "benchmark starts and stops (CPU per unit at low against high load)")
    args = parser.parse_args()
    variants = [(Path(t.partition("@")[0]).resolve(), dict(kv.split("=", 1) for kv in t.partition("@")[2].split()))
                for t in args.trees]
    trees = [tree for tree, _ in variants]
    sys.path.insert(0, str(trees[0]))
    from benchmarks.crypto_ceiling import floor_seconds
    from benchmarks.pipeline import bench_spec
    from benchmarks.stage_process import run_stage
    from pipelines.broker import LocalBroker
    from pipelines.demo.population import synthesize
    from pipelines.demo.simulate import produce_population
    from pipelines.enrolment import enrol_simulated
    from pipelines.job_config import JobConfig
    from pipelines.registry import catch_up, store_path
    from transforms.io.kafka.bounded import ensure_topics

    spec = bench_spec(args.mechanism)
    rows: dict[tuple[str, str], list[dict]] = {}
    with LocalBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        window_ms = spec.window_seconds * 1000
        start = (int(time.time() * 1000) // window_ms - 3) * window_ms
        population = synthesize(spec, args.clients, start_ms=start, seed=7)
        keys = base / "keys"
        enrol_simulated(keys, population.client_ids.tolist())
        ensure_topics(broker.bootstrap, ["rep"], partitions=3)
        produce_population(broker.bootstrap, spec, population, raw_topic="raw", reports_topic="rep")
        encoder = JobConfig(bootstrap=broker.bootstrap, specs=(spec,), out_dir=base / "encode", keys_dir=keys,
                            group_id="g-encode", drain=True, raw_topic="raw", reports_topic="rep",
                            shuffled_topic="shuf-encode")
        print(f"encoded {run_stage('encode', encoder).records} sets", flush=True)
        registry = None
        if args.registry == "kept":
            started = time.process_time()
            seeded = catch_up(base / "registry", bootstrap=broker.bootstrap, topic=None,
                              legacy_registry=encoder.keys_layout.device_registry)
            registry = str(store_path(base / "registry"))
            print(f"device store: {seeded.devices:,} devices imported once, {time.process_time() - started:.2f} s "
                  "CPU (not in the runs' CPU)", flush=True)
        runs = [(t, tree, flags, busy) for t, (tree, flags) in enumerate(variants)
                for busy in ([0, args.stress] if args.stress else [0])]
        for r in range(args.repeats):
            for t, tree, flags, busy in runs:
                tag = f"{r}-{t}-{busy}"
                name = args.trees[t] + (f" +{busy} busy" if busy else "")
                shuffled = f"shuf-{tag}"
                ensure_topics(broker.bootstrap, [shuffled], partitions=3)
                params = {"bootstrap": broker.bootstrap, "mechanism": args.mechanism, "keys": str(keys),
                          "raw": "raw", "reports": "rep", "shuffled": shuffled,
                          "beam_args": args.beam_args.split(), "registry": registry,
                          "config": {k: int(v) if v.isdigit() else v for k, v in flags.items()}}
                for stage in args.stages:
                    out = base / f"{stage}-{tag}"
                    if stage == "analyze":  # the analyzer reads what this tree's shuffler released
                        out = base / f"shuffle-{tag}"
                    profile = str(Path(args.profile) / f"{stage}-{tag}.txt") if args.profile else None
                    with busy_loops(busy):
                        result = run_in(tree, params | {"stage": stage, "out": str(out),
                                                        "group": f"g-{stage}-{tag}"}, profile,
                                        args.profile_threads == "gil")
                    floor = floor_seconds(1.0)[stage]
                    units = result["messages"] if stage == "analyze" else result["records"]
                    cpu_us = 1e6 * result["cpu"] / max(units, 1)
                    row = {"cpu_us": cpu_us, "floor_us": 1e6 * floor, "of_floor": 1e6 * floor / cpu_us,
                           "wall": result["seconds"], "rss": result["rss"], "units": units,
                           "load": os.getloadavg()[0]}
                    rows.setdefault((name, stage), []).append(row)
                    print(f"run {r} {tree} {stage}: " + ", ".join(f"{k} {v:,.2f}" for k, v in row.items()),
                          flush=True)
            if args.repeats > 3:
                for t, _, _, busy in runs:
                    shutil.rmtree(base / f"shuffle-{r}-{t}-{busy}", ignore_errors=True)
    print("\nmedians (of floor over the median floor of all runs)")
    floors = {s: statistics.median(x["floor_us"] for (_, st), v in rows.items() if st == s for x in v)
              for s in args.stages}
    for (name, stage), runs in rows.items():
        cpu = statistics.median(x["cpu_us"] for x in runs)
        print(f"{name:<32}{stage:<9} CPU us {cpu:7.1f} ({min(x['cpu_us'] for x in runs):.1f}-"
              f"{max(x['cpu_us'] for x in runs):.1f})  floor {floors[stage]:6.1f}  of floor {floors[stage] / cpu:.2f}"
              f"  wall {statistics.median(x['wall'] for x in runs):7.1f} s  rss {max(x['rss'] for x in runs):,.0f} MB"
              f"  load {statistics.median(x['load'] for x in runs):.1f}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == CHILD:
        child(Path(sys.argv[2]), json.loads(sys.argv[3]))
    else:
        main()
