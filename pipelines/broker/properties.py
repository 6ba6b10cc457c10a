"""``server.properties`` for a single-node KRaft Kafka (combined broker + controller) on loopback.

Why generated: the listeners, ports and directories differ per start (free ports, a test's own data
directory), and the security variant (SASL_SSL + ACLs) adds a dozen settings that must agree with one
another. Everything a single node needs to behave like a production cluster where this project's guarantees
live (transactions, idempotence, committed offsets) is set here: replication factors and min ISR of 1 for
the internal topics, which a one-node cluster cannot satisfy otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

#: The principal the broker itself uses (inter-broker and controller traffic) and the one tests and
#: operators use to create topics and ACLs; the only super user.
ADMIN_USER = "admin"
SCRAM = "SCRAM-SHA-512"


@dataclass(frozen=True)
class SaslSsl:
    """A SASL_SSL client listener: SCRAM-SHA-512 over TLS, with ACLs enforced by the broker.

    ``keystore_pem``: the broker's private key (unencrypted PKCS#8) followed by its certificate chain, PEM,
    with 127.0.0.1 in its subjectAltName; ``truststore_pem``: the CA certificate(s) the broker trusts (for
    its own inter-broker connections; clients get the same file). ``users``: SCRAM credentials created when
    the storage is formatted (name -> password), besides the ``admin`` super user whose password is
    ``admin_password``. Every other principal can do only what an ACL allows
    (``allow.everyone.if.no.acl.found=false``).
    """

    keystore_pem: Path
    truststore_pem: Path
    admin_password: str
    users: Mapping[str, str] = field(default_factory=dict)

    def scram_arguments(self) -> list[str]:
        """``kafka-storage format`` arguments that create every SCRAM credential with the metadata."""
        creds = {ADMIN_USER: self.admin_password, **self.users}
        return [arg for name, password in creds.items()
                for arg in ("--add-scram", f"{SCRAM}=[name={name},password={password}]")]

    def client_config(self, user: str = ADMIN_USER, password: str | None = None) -> dict[str, str]:
        """librdkafka settings for ``user`` on this listener (the admin's password by default)."""
        secret = self.admin_password if password is None and user == ADMIN_USER else password
        if secret is None:
            secret = self.users[user]
        return {"security.protocol": "SASL_SSL", "sasl.mechanism": SCRAM, "sasl.username": user,
                "sasl.password": secret, "ssl.ca.location": str(self.truststore_pem)}


def server_properties(*, port: int, controller_port: int, log_dir: Path,
                      security: SaslSsl | None = None, extra: Mapping[str, str] | None = None) -> str:
    """The broker's configuration; ``extra`` overrides or adds settings (retention, quotas, ...)."""
    props: dict[str, str] = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "controller.listener.names": "CONTROLLER",
        "log.dirs": str(log_dir),
        "num.partitions": "1",
        "auto.create.topics.enable": "true",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "8",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "min.insync.replicas": "1",
        # one node, no peers to wait for: a consumer group forms at once
        "group.initial.rebalance.delay.ms": "0",
        # a controlled shutdown has no other replica to hand leadership to; do not wait for one
        "controlled.shutdown.enable": "false",
    }
    if security is None:
        props.update({
            "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        })
    else:
        props.update(_secured(port, controller_port, security))
    props.update(extra or {})
    return "".join(f"{key}={value}\n" for key, value in props.items())


def _secured(port: int, controller_port: int, sec: SaslSsl) -> dict[str, str]:
    """SASL_SSL (SCRAM) for clients and the broker's own connections; the controller listener speaks
    SASL/PLAIN with a static credential (SCRAM credentials live in the metadata the controller serves, so
    the controller cannot use them for itself). ACLs on, nobody allowed by default, ``admin`` the super user."""
    scram_login = ('org.apache.kafka.common.security.scram.ScramLoginModule required '
                   f'username="{ADMIN_USER}" password="{sec.admin_password}";')
    plain_login = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
                   f'username="{ADMIN_USER}" password="{sec.admin_password}" '
                   f'user_{ADMIN_USER}="{sec.admin_password}";')
    return {
        "listeners": f"SASL_SSL://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"SASL_SSL://127.0.0.1:{port}",
        "inter.broker.listener.name": "SASL_SSL",
        "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:SASL_PLAINTEXT",
        "sasl.mechanism.inter.broker.protocol": SCRAM,
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.sasl_ssl.sasl.enabled.mechanisms": SCRAM,
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": scram_login,
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config": plain_login,
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(sec.keystore_pem),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(sec.truststore_pem),
        "ssl.endpoint.identification.algorithm": "https",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "false",
        "super.users": f"User:{ADMIN_USER}",
    }


LOG4J2_YAML = """Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: INFO
      AppenderRef:
        - ref: STDOUT
    Logger:
      - name: org.apache.kafka
        level: WARN
      - name: kafka.log.LogCleaner
        level: WARN
      - name: state.change.logger
        level: WARN
"""
