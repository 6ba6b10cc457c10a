"""Run one job (encode, shuffle or analyze) in a fresh process, as it runs in production, and measure it.

Why a process per stage: the jobs are separate services, each with its own memory; measured in one process,
the peak RSS would be the largest of the three plus whatever the benchmark itself holds, and Beam's
start-up would be paid once instead of once per job. The child reports its wall time (from the job's start
to its commit), its counters and its own peak RSS.
"""

from __future__ import annotations

import multiprocessing
import resource
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

#: per stage: the counter of Kafka records it reads and of the messages (reports) they carry
COUNTERS = {"encode": ("kafka_records_read", "reports_encoded"),
            "shuffle": ("kafka_records_read", "messages_released"),
            "analyze": ("kafka_records_read", "messages_analyzed")}


@dataclass(frozen=True)
class StageResult:
    stage: str
    seconds: float
    records: int
    messages: int
    peak_rss_mb: float
    counters: dict[str, int]
    cpu_seconds: float = 0.0  # user + system CPU of the job's process (all threads) and of any workers it reaped

    @property
    def cpu_per_record(self) -> float:
        return self.cpu_seconds / self.records if self.records else 0.0

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0

    @property
    def messages_per_s(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0


def _vm_hwm_mb() -> float:
    """This process's own peak RSS. Not ``ru_maxrss``: Linux carries into it the RSS the process had before
    ``exec`` (a copy of the forking parent's), so a child of a large benchmark would report the parent."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # not Linux


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process's threads and of its reaped children (SDK workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _child(stage: str, config: Any, beam_args: list[str]) -> StageResult:
    import logging

    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines import analyze, encode, shuffle

    logging.basicConfig(level=logging.WARNING)
    job = {"encode": encode, "shuffle": shuffle, "analyze": analyze}[stage]
    started, cpu_started = time.perf_counter(), _cpu_seconds()
    summary = job.run(config.for_stage(stage), PipelineOptions(beam_args))
    seconds, cpu = time.perf_counter() - started, _cpu_seconds() - cpu_started
    records, messages = (summary.count(name) for name in COUNTERS[stage])
    peak = _vm_hwm_mb()
    return StageResult(stage, seconds, records, messages, peak, dict(summary.counters), cpu)


def run_stage(stage: str, config: Any, beam_args: list[str] | None = None) -> StageResult:
    """Run ``stage`` of ``config`` (a JobConfig) in a freshly spawned process and return what it measured."""
    context = multiprocessing.get_context("spawn")  # no inherited broker sockets, threads or memory
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(_child, stage, config, list(beam_args or [])).result()
