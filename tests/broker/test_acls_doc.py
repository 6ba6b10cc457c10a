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
    assert reads == {("User:edge", "telemetry"), ("User:shuffler", "reports"), ("User:analyzer", "shuffled")}
    writes = {(who, name) for who, kind, name, _, op in grants if kind == "TOPIC" and op == "WRITE"}
    assert ("User:device", "shuffled") not in writes and ("User:analyzer", "reports") not in writes
    assert {who for who, name in writes if name == "telemetry"} == {"User:collector"}
