"""The broker-side ACLs of a deployment, one principal per trust domain.

Why the broker enforces them: the jobs keep their domains apart in code, but only the broker can stop a
stolen device credential from reading the shuffled topic, or an analyzer's from reading the reports topic
(which names every device). Each principal gets exactly what its job does, nothing else; topics are created
beforehand by an administrator, so no job principal needs CREATE.

==============  =============================================================================
principal       may
==============  =============================================================================
collector       WRITE the raw topic (the edge collector: the raw topic is edge-only, never a device's)
device          WRITE (and DESCRIBE) the reports topic
edge            READ the raw topic with its consumer group; WRITE the reports topic and its own
                dead-letter topic, and READ it (the edge encoder, in the device's trust domain: its dead
                letters are raw events with client ids, readable by no other principal); its
                transactional ids (prefix ``esa-encoder``): each run's sets are written in one transaction
shuffler        READ the reports topic with its group; WRITE the shuffled topic and its dead-letter
                topic; its transactional ids (prefix ``esa-shuffler``) for fenced release publishing;
                READ and WRITE the devices topic (enrolments: the shuffler's device store reads it; the HTTP
                ingestion edge, ``esa edge``, and the keys tool write it, both in the shuffler's domain)
analyzer        READ the shuffled topic with its group; WRITE the estimates topic and its dead-letter
                topic (reasons and positions only)
(each job)      DESCRIBE_CONFIGS of the topics it reads and writes (the cleanup-policy check)
==============  =============================================================================
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: transactional.id prefix of the shuffler's release producers
SHUFFLER_TRANSACTIONAL_PREFIX = "esa-shuffler"
#: transactional.id prefix of the edge encoder's run writers (pipelines.encode.TRANSACTIONAL_PREFIX)
ENCODER_TRANSACTIONAL_PREFIX = "esa-encoder"

#: The one table of consumer groups: each job's default ``--consumer_group`` (``pipelines.job_config``) and the
#: group its principal is granted READ on (below, and the ACL table of docs/operations.md), so a deployment
#: that follows the docs runs with the defaults. ``esa run`` (every stage in one process) uses all three.
DEFAULT_GROUPS: dict[str, str] = {"encode": "esa-encode", "shuffle": "esa-shuffle", "analyze": "esa-analyze"}


@dataclass(frozen=True)
class DeploymentTopics:
    """The topics and consumer groups the ACLs name (a deployment's own names)."""

    raw: str = "telemetry"
    reports: str = "reports"
    shuffled: str = "shuffled"
    estimates: str = "estimates"
    devices: str = "devices"
    edge_group: str = DEFAULT_GROUPS["encode"]
    shuffler_group: str = DEFAULT_GROUPS["shuffle"]
    analyzer_group: str = DEFAULT_GROUPS["analyze"]
    edge_dead_letters: str = "dead-letters-encode"
    shuffler_dead_letters: str = "dead-letters-shuffle"
    analyzer_dead_letters: str = "dead-letters-analyze"


#: (principal, resource type, name, pattern, operation) for every grant; names are DeploymentTopics fields
_GRANTS: tuple[tuple[str, str, str, str, str], ...] = (
    ("collector", "TOPIC", "raw", "LITERAL", "WRITE"),
    ("device", "TOPIC", "reports", "LITERAL", "WRITE"),
    ("device", "TOPIC", "reports", "LITERAL", "DESCRIBE"),
    ("edge", "TOPIC", "raw", "LITERAL", "READ"),
    ("edge", "GROUP", "edge_group", "LITERAL", "READ"),
    ("edge", "TOPIC", "reports", "LITERAL", "WRITE"),
    ("edge", "TOPIC", "edge_dead_letters", "LITERAL", "WRITE"),
    ("edge", "TOPIC", "edge_dead_letters", "LITERAL", "READ"),
    ("edge", "TRANSACTIONAL_ID", ENCODER_TRANSACTIONAL_PREFIX, "PREFIXED", "WRITE"),
    ("edge", "TRANSACTIONAL_ID", ENCODER_TRANSACTIONAL_PREFIX, "PREFIXED", "DESCRIBE"),
    ("shuffler", "TOPIC", "reports", "LITERAL", "READ"),
    ("shuffler", "GROUP", "shuffler_group", "LITERAL", "READ"),
    ("shuffler", "TOPIC", "shuffled", "LITERAL", "WRITE"),
    ("shuffler", "TOPIC", "shuffled", "LITERAL", "DESCRIBE"),
    ("shuffler", "TOPIC", "shuffler_dead_letters", "LITERAL", "WRITE"),
    ("shuffler", "TRANSACTIONAL_ID", SHUFFLER_TRANSACTIONAL_PREFIX, "PREFIXED", "WRITE"),
    ("shuffler", "TRANSACTIONAL_ID", SHUFFLER_TRANSACTIONAL_PREFIX, "PREFIXED", "DESCRIBE"),
    ("shuffler", "TOPIC", "devices", "LITERAL", "READ"),
    ("shuffler", "TOPIC", "devices", "LITERAL", "DESCRIBE"),
    ("shuffler", "TOPIC", "devices", "LITERAL", "WRITE"),
    ("analyzer", "TOPIC", "shuffled", "LITERAL", "READ"),
    ("analyzer", "GROUP", "analyzer_group", "LITERAL", "READ"),
    ("analyzer", "TOPIC", "estimates", "LITERAL", "WRITE"),
    ("analyzer", "TOPIC", "analyzer_dead_letters", "LITERAL", "WRITE"),
    # Each job reads the configuration of the topics it uses: a compacted or short-lived one is refused
    # (transforms.io.kafka.topic_policy); without this grant the check is skipped with a warning.
    *((who, "TOPIC", name, "LITERAL", "DESCRIBE_CONFIGS") for who, names in (
        ("edge", ("raw", "reports", "edge_dead_letters")),
        ("shuffler", ("reports", "shuffled", "shuffler_dead_letters")),
        ("analyzer", ("shuffled", "estimates", "analyzer_dead_letters"))) for name in names),
)


def domain_grants(topics: DeploymentTopics,
                  principals: Mapping[str, str] | None = None) -> list[tuple[str, str, str, str, str]]:
    """Every grant as (principal, resource type, resource name, pattern type, operation), resolved against
    ``topics``; ``principals`` renames the domains' users (``{"shuffler": "svc-shuffle"}``)."""
    names = dict(principals or {})
    return [(f"User:{names.get(who, who)}", kind, getattr(topics, name, name), pattern, op)
            for who, kind, name, pattern, op in _GRANTS]


def kafka_acls_commands(topics: DeploymentTopics, bootstrap: str = "BROKER:9093",
                        admin_config: str = "admin.properties") -> list[str]:
    """The same grants as ``kafka-acls.sh`` command lines, for an operator (docs/operations.md shows them)."""
    flags = {"TOPIC": "--topic", "GROUP": "--group", "TRANSACTIONAL_ID": "--transactional-id"}
    out = []
    for principal, kind, name, pattern, op in domain_grants(topics):
        prefixed = " --resource-pattern-type prefixed" if pattern == "PREFIXED" else ""
        out.append(f"kafka-acls.sh --bootstrap-server {bootstrap} --command-config {admin_config} --add "
                   f"--allow-principal {principal} --operation {_camel(op)} {flags[kind]} {name}{prefixed}")
    return out


def _camel(operation: str) -> str:
    """``DESCRIBE_CONFIGS`` -> ``DescribeConfigs``, as kafka-acls.sh names operations."""
    return "".join(word.title() for word in operation.split("_"))


def apply_domain_acls(bootstrap: str, admin_config: Mapping[str, Any], topics: DeploymentTopics,
                      principals: Mapping[str, str] | None = None, timeout_s: float = 30.0) -> int:
    """Create every grant on the broker as its administrator (librdkafka settings); returns how many once
    the broker's authorizer serves them all (ACLs reach it asynchronously, through the metadata log)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap, **admin_config})
    bindings = [AclBinding(ResourceType[kind], name, ResourcePatternType[pattern], principal, "*",
                           AclOperation[op], AclPermissionType.ALLOW)
                for principal, kind, name, pattern, op in domain_grants(topics, principals)]
    for future in admin.create_acls(bindings, request_timeout=timeout_s).values():
        future.result(timeout_s)
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                                  AclPermissionType.ANY)
    deadline = time.monotonic() + timeout_s
    while not set(bindings) <= set(admin.describe_acls(everything, request_timeout=timeout_s).result(timeout_s)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the broker at {bootstrap} did not serve the new ACLs within {timeout_s:g} s")
        time.sleep(0.1)
    return len(bindings)
