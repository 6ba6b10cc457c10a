"""Helpers of the exactly-once tests: one population on a real broker, the three jobs as real processes.

A job runs in a process of its own so that a fault injected with ``ESA_CRASH_AT`` or an external ``kill -9``
kills a real process, as it would in production; the child prints its RunSummary as one JSON line. The process
is forked from a multiprocessing fork server that imported the three jobs once (Beam, SciPy, dp_accounting).
Why: a fresh interpreter spent ~3.5 s of CPU on those imports per job, and the exactly-once tests start 17; the
server is a fresh interpreter that starts no thread (the test process, which may hold Beam's, is never forked).
Everything a check needs afterwards is read from the places a user would look: the ledgers, the estimates
store, the run state and the topics' offsets.
"""

from __future__ import annotations

import atexit
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SPEC_PATH = REPO / "examples" / "app_language.toml"
STAGES = ("encode", "shuffle", "analyze")


@dataclass(frozen=True)
class Chain:
    """The topics and directories of one chain of jobs (one trust domain per stage, keys shared)."""

    bootstrap: str
    raw: str
    reports: str
    shuffled: str
    out: Path
    keys: Path
    group: str
    seed: int = 7
    drain: bool = True
    now_ms: int | None = None
    spec_path: str = str(SPEC_PATH)

    def state(self, stage: str) -> Path:
        return self.out / "state" / stage

    def config(self, stage: str) -> Any:
        from pipelines.job_config import JobConfig
        from transforms.spec import load_spec

        return JobConfig(bootstrap=self.bootstrap, specs=(load_spec(self.spec_path),), out_dir=self.out,
                         state_dir=self.state(stage), keys_dir=self.keys, raw_topic=self.raw,
                         reports_topic=self.reports, shuffled_topic=self.shuffled, group_id=f"{self.group}-{stage}",
                         seed=self.seed, drain=self.drain, now_ms=self.now_ms, create_topics=True)

    def as_json(self) -> str:
        fields = {k: str(v) if isinstance(v, Path) else v for k, v in self.__dict__.items()}
        return json.dumps(fields)

    def at(self, now_ms: int | None = None, drain: bool | None = None) -> Chain:
        return replace(self, now_ms=now_ms if now_ms is not None else self.now_ms,
                       drain=self.drain if drain is None else drain)


@dataclass
class JobResult:
    returncode: int
    summary: dict[str, Any] | None
    stderr: str

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL


def _env(crash_at: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "ESA_CRASH_AT"}
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(REPO)
    if crash_at:
        env["ESA_CRASH_AT"] = crash_at
    return env


PRELOAD = ["pipelines.encode", "pipelines.shuffle", "pipelines.analyze", "tests.e2e.chain_harness"]


@dataclass
class JobProcess:
    """A started job: its process (``pid`` for signals) and the files its stdout and stderr go to."""

    process: multiprocessing.process.BaseProcess
    logs: Path

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid


def start_job(chain: Chain, stage: str, crash_at: str | None = None) -> JobProcess:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)  # read when the server starts: the first job of the session
    logs = Path(tempfile.mkdtemp(prefix="esa-job-"))
    process = context.Process(target=_forked, args=(stage, chain.as_json(), _env(crash_at), str(logs)))
    process.start()
    return JobProcess(process, logs)


def _forked(stage: str, payload: str, env: dict[str, str], logs: str) -> None:
    """The job in the forked process, with the environment, directory and output a fresh interpreter would have
    had; the interpreter's exit handlers run at the end, as at a normal exit."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(REPO)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        target = os.open(os.path.join(logs, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    try:
        _child(stage, payload)
    finally:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()


def wait_job(job: JobProcess | subprocess.Popen, timeout: float = 180) -> JobResult:
    """The job's exit code, its RunSummary line and its stderr; ``job`` forked here or started as a fresh
    interpreter (``subprocess.Popen`` with piped text output: tests/deploy/staging_child.py's jobs)."""
    if isinstance(job, subprocess.Popen):
        out, err = job.communicate(timeout=timeout)
        code = job.returncode
    else:
        job.process.join(timeout)
        if job.process.exitcode is None:
            raise subprocess.TimeoutExpired(f"job {job.pid}", timeout)
        out, err = ((job.logs / name).read_text() if (job.logs / name).exists() else ""
                    for name in ("stdout", "stderr"))
        shutil.rmtree(job.logs, ignore_errors=True)
        code = job.process.exitcode
    lines = [line for line in out.splitlines() if line.startswith("{")]
    return JobResult(code, json.loads(lines[-1]) if lines else None, err)


def run_job(chain: Chain, stage: str, crash_at: str | None = None) -> JobResult:
    """Run one bounded job in a subprocess; with ``crash_at`` it must die by SIGKILL at that point."""
    result = wait_job(start_job(chain, stage, crash_at))
    if crash_at:
        assert result.killed, (crash_at, result.returncode, result.stderr[-2000:])
    else:
        assert result.returncode == 0 and result.summary, result.stderr[-3000:]
    return result


def wait_for(predicate: Any, timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def topic_records(bootstrap: str, topic: str) -> int:
    """Records a read_committed consumer reads on a topic. Not end offsets minus beginnings: a transactional
    producer (the encoder's runs, the shuffler's releases) leaves a commit marker at an offset of its own."""
    return len(_read_all(bootstrap, topic))


def topic_read_ends(bootstrap: str, topic: str) -> dict[int, int]:
    """Per partition, the offset after its last record: what a consumer that read everything commits (a stream
    commits the offset after the last record it read, never a commit marker's)."""
    ends: dict[int, int] = {}
    for record in _read_all(bootstrap, topic):
        ends[record.partition] = max(ends.get(record.partition, 0), record.offset + 1)
    return ends


def _read_all(bootstrap: str, topic: str) -> list[Any]:
    from transforms.io.kafka.bounded import read_topic

    return read_topic(bootstrap, topic)


def stream_read_everything(bootstrap: str, group: str, topic: str, ends: dict[int, int]) -> bool:
    """Whether ``group`` has committed, on every partition, the offset after its last record."""
    from transforms.io.kafka.bounded import committed_offsets

    committed = committed_offsets(bootstrap, group, topic)
    return all(committed.get(partition, 0) >= end for partition, end in ends.items())


def ledger_entries(chain: Chain, stage: str) -> list[Any]:
    from transforms.state.ledger import ReleaseLedger

    return sorted(ReleaseLedger(chain.state(stage) / "ledger").entries(), key=lambda e: e.key.window_end_ms)


def estimate_parts(chain: Chain) -> dict[int, list[Path]]:
    """window_end_ms -> the Parquet parts written for it."""
    parts: dict[int, list[Path]] = {}
    for path in sorted((chain.out / "estimates").rglob("part-*.parquet")):
        window = int(path.parent.name.split("=", 1)[1])
        parts.setdefault(window, []).append(path)
    return parts


def estimate_rows(chain: Chain) -> list[tuple]:
    """(window_end, item, estimate, stderr, n_clients, eps_central) per estimate row, sorted."""
    from transforms.state.estimates_store import read_estimates

    table = read_estimates(chain.out).to_pydict()
    return sorted(zip(table["window_end"], table["item"], table["estimate"], table["stderr"], table["n_clients"],
                      table["eps_central"], strict=True))


def _child(stage: str, payload: str) -> None:
    import logging

    from pipelines import analyze, encode, shuffle

    logging.basicConfig(level=logging.WARNING)
    fields = json.loads(payload)
    for name in ("out", "keys"):
        fields[name] = Path(fields[name])
    chain = Chain(**fields)
    module = {"encode": encode, "shuffle": shuffle, "analyze": analyze}[stage]
    summary = module.run(chain.config(stage))
    print(json.dumps({"counters": summary.counters, "parts": summary.parts, "balanced": summary.balanced,
                      "extra": {k: v for k, v in summary.extra.items() if isinstance(v, (int, str))}}), flush=True)


def new_chain(bootstrap: str, base: Path, name: str, *, raw: str | None = None, keys: Path | None = None,
              **kw: Any) -> Chain:
    """A chain with its own topics (3 partitions each) and directories under ``base/name``."""
    from transforms.io.kafka.bounded import ensure_topics

    tag = f"{name}-{base.name}"
    chain = Chain(bootstrap=bootstrap, raw=raw or f"raw-{tag}", reports=f"rep-{tag}", shuffled=f"shuf-{tag}",
                  out=base / name, keys=keys or base / "keys", group=f"g-{tag}", **kw)
    ensure_topics(bootstrap, [chain.raw, chain.reports, chain.shuffled], partitions=3)
    return chain


def produce(chain: Chain, population: Any, bad_per_kind: int = 0) -> None:
    """Enrol the population's devices (keys of ``chain.keys``) and produce its events to the raw topic."""
    from pipelines.demo.simulate import produce_population
    from pipelines.enrolment import enrol_simulated
    from transforms.spec import load_spec

    enrol_simulated(chain.keys, population.client_ids.tolist())
    produce_population(chain.bootstrap, load_spec(SPEC_PATH), population, raw_topic=chain.raw,
                       reports_topic=chain.reports, bad_per_kind=bad_per_kind, seed=1)


def run_inline(chain: Chain, stages: tuple[str, ...] = STAGES) -> dict[str, Any]:
    """The stages in this process (faster than a subprocess; for runs that are not being killed)."""
    from pipelines import analyze, encode, shuffle

    modules = {"encode": encode, "shuffle": shuffle, "analyze": analyze}
    return {stage: modules[stage].run(chain.config(stage)) for stage in stages}


def bounded_reference(bootstrap: str, base: Path, n: int, windows: int, seed: int,
                      bad_per_kind: int = 0) -> tuple[Chain, dict[str, Any]]:
    """A population of ``n`` clients over ``windows`` recent windows, produced and run through the bounded
    chain (shuffle with --drain): the reference the streaming shuffler must equal."""
    from pipelines.demo.population import synthesize
    from transforms.spec import load_spec

    spec = load_spec(SPEC_PATH)
    chain = new_chain(bootstrap, base, "bounded")
    produce(chain, synthesize(spec, n, windows=windows, start_ms=recent_start(spec.window_seconds * 1000, back=4),
                              seed=seed), bad_per_kind=bad_per_kind)
    return chain, run_inline(chain)


def stream_twin(bounded: Chain, out: Path) -> Chain:
    """The same reports topic and keys, shuffled by the streaming job into its own state, group and topic."""
    from transforms.io.kafka.bounded import ensure_topics

    stream = replace(bounded, shuffled=f"{bounded.shuffled}-sdf", out=out, group=f"{bounded.group}-sdf",
                     drain=False)
    ensure_topics(bounded.bootstrap, [stream.shuffled], partitions=3)
    return stream


def recent_start(window_ms: int, back: int = 3) -> int:
    return (int(time.time() * 1000) // window_ms - back) * window_ms


def cli_argv(chain: Chain, command: str, *extra: str) -> list[str]:
    """``python -m pipelines.cli COMMAND`` on this chain (``run``: STATE is the parent of the stages' dirs)."""
    state = chain.out / "state" if command == "run" else chain.state(command)
    argv = [sys.executable, "-m", "pipelines.cli", command, "--spec", str(SPEC_PATH),
            "--kafka_bootstrap", chain.bootstrap, "--output_dir", str(chain.out), "--state_dir", str(state),
            "--keys_dir", str(chain.keys), "--raw_topic", chain.raw, "--reports_topic", chain.reports,
            "--shuffled_topic", chain.shuffled, "--consumer_group", f"{chain.group}-{command}",
            "--seed", str(chain.seed), "--create_topics"]
    return argv + (["--drain"] if chain.drain else []) + list(extra)


def start_cli(chain: Chain, command: str, *extra: str, file_size_limit: int | None = None) -> subprocess.Popen:
    """``esa COMMAND`` on this chain in a subprocess; ``file_size_limit``: the kernel refuses (EFBIG) any write
    that would make one of its files larger than that many bytes, as a full disk refuses one (ENOSPC)."""
    return subprocess.Popen(cli_argv(chain, command, *extra), env=_env(None), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=None if file_size_limit is None else _limit_file_size(file_size_limit))


def _limit_file_size(limit: int) -> Any:
    def apply() -> None:  # in the child, before exec; an ignored signal stays ignored across exec
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a refused write then fails with EFBIG instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def subset(population: Any, index: Any) -> Any:
    """The clients ``index`` of a population (same values and event times)."""
    from pipelines.demo.population import Population

    crowds = population.crowd_ids[index] if population.crowd_ids is not None else None
    return Population(population.client_ids[index], population.values[index], population.event_times_ms[index],
                      population.window_ms, crowds)


def files_under(directory: Path) -> dict[str, bytes]:
    """Relative path -> bytes of every file under ``directory`` (empty if it does not exist)."""
    if not directory.is_dir():
        return {}
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}
