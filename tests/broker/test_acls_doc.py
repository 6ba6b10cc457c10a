"""docs/operations.md shows the very grants `pipelines.broker.acls` applies (the tests' broker enforces them)."""

from __future__ import annotations

from pathlib import Path

from pipelines.broker.acls import DeploymentTopics, domain_grants, kafka_acls_commands

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def test_the_operations_doc_lists_every_grant() -> None:
    text = DOC.read_text(encoding="utf-8")
    missing = [c for c in kafka_acls_commands(DeploymentTopics()) if c not in text]
    assert not missing, missing


def test_no_domain_may_read_what_it_must_not() -> None:
    grants = domain_grants(DeploymentTopics())
    reads = {(who, name) for who, kind, name, _, op in grants if kind == "TOPIC" and op == "READ"}
    assert reads == {("User:edge", "telemetry"), ("User:shuffler", "reports"), ("User:analyzer", "shuffled"),
                     ("User:edge", "dead-letters-encode"),  # raw events with client ids: the edge's own only
                     ("User:shuffler", "devices")}  # enrolments (device id -> public key): the shuffler's domain
    writes = {(who, name) for who, kind, name, _, op in grants if kind == "TOPIC" and op == "WRITE"}
    assert ("User:device", "shuffled") not in writes and ("User:analyzer", "reports") not in writes
    assert {who for who, name in writes if name == "telemetry"} == {"User:collector"}


def test_each_jobs_default_consumer_group_is_the_group_its_principal_may_read() -> None:
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines.job_config import config_from_options

    topics = DeploymentTopics()
    granted = {who: name for who, kind, name, _, op in domain_grants(topics) if kind == "GROUP" and op == "READ"}
    config = config_from_options(PipelineOptions(["--spec", "examples/feature_usage.toml"]))
    assert config.group_id == ""  # no flag: each stage takes its own
    defaults = {stage: config.with_group(stage).group_id for stage in ("encode", "shuffle", "analyze")}
    assert defaults == {"encode": granted["User:edge"], "shuffle": granted["User:shuffler"],
                        "analyze": granted["User:analyzer"]}
    assert config.for_stage("shuffle").group_id == granted["User:shuffler"]  # esa run's stages too
    chosen = config_from_options(PipelineOptions(["--spec", "examples/feature_usage.toml", "--consumer_group", "g"]))
    assert chosen.with_group("encode").group_id == "g"


def test_the_encoders_transactional_ids_are_granted_to_the_edge() -> None:
    from pipelines.broker.acls import ENCODER_TRANSACTIONAL_PREFIX
    from pipelines.encode import TRANSACTIONAL_PREFIX

    assert TRANSACTIONAL_PREFIX == ENCODER_TRANSACTIONAL_PREFIX
    granted = {(who, op) for who, kind, name, pattern, op in domain_grants(DeploymentTopics())
               if kind == "TRANSACTIONAL_ID" and name == ENCODER_TRANSACTIONAL_PREFIX and pattern == "PREFIXED"}
    assert granted == {("User:edge", "WRITE"), ("User:edge", "DESCRIBE")}
