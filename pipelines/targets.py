"""The typed targets the domains' release steps write to, made from a job's ``JobConfig`` in one place.

Why: a domain's release step (``transforms.shuffler.release_step``, ``transforms.analyzer.release_step``) names
exactly what it writes (paths, topics, client settings) and nothing of the job's other options, so it runs and
is tested without a job, and the jobs' flags stay the jobs' business.
"""

from __future__ import annotations

from pipelines.job_config import JobConfig
from pipelines.preflight import domain_dead_letter_topic
from transforms.analyzer.release_step import EstimatesTarget
from transforms.io.kafka.writer import KafkaTarget
from transforms.shuffler.release_step import ReleaseTarget


def kafka_target(config: JobConfig, topic: str | None) -> KafkaTarget | None:
    """``topic`` on the job's broker with its client settings; None where no topic is set."""
    if not topic:
        return None
    return KafkaTarget.of(config.bootstrap, str(topic), config.kafka_config, config.kafka_client)


def release_target(config: JobConfig) -> ReleaseTarget:
    """What the shuffler's release step (and its streaming release agent) writes to."""
    stream = KafkaTarget.of(config.bootstrap, config.shuffled_topic, config.kafka_config, config.kafka_client)
    return ReleaseTarget(config.state_layout, config.keys, stream,
                         kafka_target(config, domain_dead_letter_topic(config.dead_letter_topic, "shuffle")),
                         config.seed)


def estimates_target(config: JobConfig) -> EstimatesTarget:
    """What the analyzer's release step writes to."""
    return EstimatesTarget(config.out_dir, config.state_layout.failed_releases,
                           kafka_target(config, config.estimates_topic))
