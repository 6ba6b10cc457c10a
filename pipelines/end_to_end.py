"""The whole chain as one command: raw topic -> encode -> reports -> shuffle -> shuffled -> analyze -> estimates.

The three stages run as the three jobs they are in production, one after the other, each in its own trust
domain with its own state directory (``STATE/encode``, ``STATE/shuffle``, ``STATE/analyze``) and talking
only through Kafka topics: the analyzer of a demo holds no more than the analyzer of a deployment. Each
stage is exactly-once on its own (see ``pipelines.job``), so the chain is too; ``--follow`` repeats the
chain. Accounting is per stage: every stage's records balance on their own.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from pipelines import analyze, encode, shuffle
from pipelines.exit_codes import ConfigError
from pipelines.job_config import JobConfig, RunSummary, config_from_options
from pipelines.preflight import require_topics
from transforms.io.kafka.bounded import ensure_topics


@dataclass
class ChainSummary:
    """The three stages' summaries of one pass of the chain."""

    stages: dict[str, RunSummary] = field(default_factory=dict)
    seconds: float = 0.0
    stage: str = "end_to_end"

    def count(self, name: str) -> int:
        return sum(s.count(name) for s in self.stages.values())

    @property
    def accounting(self) -> dict[str, dict[str, int]]:
        return {name: s.accounting for name, s in self.stages.items()}

    @property
    def balanced(self) -> bool:
        return all(s.balanced for s in self.stages.values())

    def records_read_and_dead(self) -> tuple[int, int]:
        """(records that entered the chain, all dead letters): raw events read by the encoder, or sets
        written by devices and read by the shuffler, whichever is more."""
        read = max(s.count("kafka_records_read") for s in self.stages.values()) if self.stages else 0
        return read, self.count("dead_lettered")

    @property
    def out_dir(self) -> Path:
        return self.stages["analyze"].out_dir

    @property
    def estimates_path(self) -> Path:
        return self.stages["analyze"].estimates_path

    @property
    def dead_letters_path(self) -> Path:
        return self.stages["analyze"].dead_letters_path


def run(config: JobConfig, options: PipelineOptions | None = None) -> ChainSummary:
    """One pass of the chain over what is new on the topics."""
    started = time.perf_counter()
    if not config.reports_topic:
        from dataclasses import replace

        config = replace(config, reports_topic=f"{config.raw_topic}-reports")
    # The broker answers and the raw topic exists, or one line and exit 4, before any topic is created.
    require_topics(config.bootstrap, [config.raw_topic], client=config.kafka_client, kafka_config=config.kafka_config)
    ensure_topics(config.bootstrap, [config.reports_topic, config.shuffled_topic], partitions=3,
                  client_config=config.kafka_config, client=config.kafka_client)
    summary = ChainSummary()
    summary.stages["encode"] = encode.run(config.for_stage("encode"), options)
    summary.stages["shuffle"] = shuffle.run(config.for_stage("shuffle"), options)
    summary.stages["analyze"] = analyze.run(config.for_stage("analyze"), options)
    summary.seconds = time.perf_counter() - started
    return summary


def run_from_argv(argv: Sequence[str]) -> ChainSummary:
    """``esa run --spec X.toml --kafka_bootstrap HOST:PORT --output_dir D ...`` (Beam flags pass through)."""
    options = PipelineOptions(list(argv))
    config = config_from_options(options)
    if options.view_as(StandardOptions).streaming:
        # The chain's encode and analyze are bounded pipelines: --streaming would reach them too.
        raise ConfigError("esa run: --streaming would apply to the bounded encode and analyze as well; run the "
                          "streaming shuffler as its own job (esa shuffle --kafka_io sdf --streaming)")
    return run(config, options)
