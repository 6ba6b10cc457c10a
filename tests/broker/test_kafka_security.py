"""Security the broker enforces: SASL_SSL (SCRAM-SHA-512 over TLS) and ACLs per trust domain, no mocks.

A broker with only a SASL_SSL listener and ``allow.everyone.if.no.acl.found=false``; the grants of
`pipelines.broker.acls` for one deployment's topics. Each job runs as its own principal (the edge encoder,
the shuffler, the analyzer) on both Kafka clients, and every refusal an operator can meet is one line and
exit 4: a principal reading a topic its domain must not read, a wrong password, a client that does not
trust the broker's CA, plaintext on the TLS port. A device writing the shuffled topic is refused by the
broker with a write error naming the authorization failure, and so is a device writing the raw topic (which
only the edge collector may write: an event there is signed by the edge encoder in any enrolled device's name).
"""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from pipelines.broker import LocalBroker, SaslSsl
from pipelines.broker.acls import DeploymentTopics, apply_domain_acls
from pipelines.demo.population import synthesize
from pipelines.demo.simulate import telemetry_messages
from pipelines.enrolment import enrol_simulated
from tests.broker.tls import make_tls
from tests.e2e.chain_harness import SPEC_PATH, Chain, cli_argv, recent_start
from transforms.io.kafka.bounded import KafkaWriteError, produce_records
from transforms.io.kafka.config import CLIENTS
from transforms.spec import load_spec
from transforms.trust.keys import init_keys

pytestmark = pytest.mark.slow
USERS = ("collector", "device", "edge", "shuffler", "analyzer")
N_CLIENTS = 400


@dataclass(frozen=True)
class Secured:
    broker: LocalBroker
    base: Path
    passwords: dict[str, str]
    foreign_ca: Path

    def config_file(self, user: str, **override: str) -> Path:
        """A job's ``--kafka_config`` for ``user`` (kafka-python names, as operators write them)."""
        settings = {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                    "sasl_plain_username": user, "sasl_plain_password": self.passwords[user],
                    "ssl_cafile": str(self.broker.security.truststore_pem) if self.broker.security else "",
                    **override}
        path = self.base / f"{user}-{secrets.token_hex(3)}.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        return path

    def topics(self, tag: str) -> DeploymentTopics:
        return DeploymentTopics(raw=f"raw-{tag}", reports=f"rep-{tag}", shuffled=f"shuf-{tag}",
                                edge_group=f"g-{tag}-encode", shuffler_group=f"g-{tag}-shuffle",
                                analyzer_group=f"g-{tag}-analyze")


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    base = tmp_path_factory.mktemp("secured")
    tls = make_tls(base / "tls")
    foreign = make_tls(base / "foreign", ca_name="someone else's CA")
    passwords = {user: secrets.token_urlsafe(12) for user in USERS}
    security = SaslSsl(tls.keystore, tls.truststore, admin_password=secrets.token_urlsafe(12), users=passwords)
    with LocalBroker(security=security) as broker:
        yield Secured(broker, base, passwords, foreign.truststore)


def _deploy(secured: Secured, tag: str) -> tuple[DeploymentTopics, Chain]:
    """The deployment's topics (made by the administrator) and ACLs, and a chain naming them."""
    broker, topics = secured.broker, secured.topics(tag)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, **broker.client_config()})
    for future in admin.create_topics([NewTopic(t, 3, 1) for t in (topics.raw, topics.reports,
                                                                   topics.shuffled)]).values():
        future.result(30)
    apply_domain_acls(broker.bootstrap, broker.client_config(), topics)
    chain = Chain(bootstrap=broker.bootstrap, raw=topics.raw, reports=topics.reports, shuffled=topics.shuffled,
                  out=secured.base / tag, keys=secured.base / tag / "keys", group=f"g-{tag}")
    return topics, chain


def _job(chain: Chain, stage: str, config: Path, client: str) -> subprocess.CompletedProcess[str]:
    argv = cli_argv(chain, stage, "--kafka_config", str(config), "--kafka_client", client)
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("client", CLIENTS)
def test_each_job_runs_as_its_own_principal(secured: Secured, client: str) -> None:
    topics, chain = _deploy(secured, f"ok-{client}")
    spec = load_spec(SPEC_PATH)
    population = synthesize(spec, N_CLIENTS, start_ms=recent_start(spec.window_seconds * 1000), seed=5)
    enrol_simulated(chain.keys, population.client_ids.tolist())
    collector = {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                 "sasl_plain_username": "collector", "sasl_plain_password": secured.passwords["collector"],
                 "ssl_cafile": str(secured.broker.security.truststore_pem)}
    produce_records(chain.bootstrap, topics.raw, telemetry_messages(spec, population), producer_config=collector,
                    client=client)
    for stage, user in (("encode", "edge"), ("shuffle", "shuffler"), ("analyze", "analyzer")):
        done = _job(chain, stage, secured.config_file(user), client)
        assert done.returncode == 0, f"{stage} as {user}: {done.stderr[-2000:]}"
    assert any((chain.out / "estimates").rglob("*.parquet")), "no estimate was written"


@pytest.fixture(scope="module")
def refusals(secured: Secured) -> Chain:
    _, chain = _deploy(secured, "refused")
    init_keys(chain.keys)  # the jobs check their keys before they touch Kafka: these tests are about Kafka's refusals
    return chain


def _one_line_exit_4(done: subprocess.CompletedProcess[str], *fragments: str) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 4, done.stderr[-2000:]
    assert len(lines) == 1, lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def test_the_analyzer_cannot_read_the_reports_topic(secured: Secured, refusals: Chain) -> None:
    as_shuffler_input = replace(refusals, shuffled=refusals.reports)  # the analyzer pointed at the reports topic
    done = _job(as_shuffler_input, "analyze", secured.config_file("analyzer"), "confluent")
    _one_line_exit_4(done, "not authorized", refusals.reports)


def test_a_wrong_password_is_refused(secured: Secured, refusals: Chain) -> None:
    done = _job(refusals, "shuffle", secured.config_file("shuffler", sasl_plain_password="not-the-password"),
                "confluent")
    _one_line_exit_4(done, "uthentication")


def test_a_client_that_does_not_trust_the_ca_is_refused(secured: Secured, refusals: Chain) -> None:
    done = _job(refusals, "shuffle", secured.config_file("shuffler", ssl_cafile=str(secured.foreign_ca)),
                "confluent")
    _one_line_exit_4(done, "certificate")


def test_plaintext_to_the_tls_port_is_refused(secured: Secured, refusals: Chain) -> None:
    done = _job(refusals, "shuffle", secured.config_file("shuffler", security_protocol="PLAINTEXT"), "confluent")
    _one_line_exit_4(done, "cannot reach Kafka")


@pytest.mark.parametrize("client", CLIENTS)
def test_a_device_cannot_write_the_shuffled_or_the_raw_topic(secured: Secured, refusals: Chain, client: str) -> None:
    device = {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
              "sasl_plain_username": "device", "sasl_plain_password": secured.passwords["device"],
              "ssl_cafile": str(secured.broker.security.truststore_pem)}
    produce_records(refusals.bootstrap, refusals.reports, [b"a report"], producer_config=device, client=client)
    with pytest.raises(KafkaWriteError, match=r"(?i)authoriz"):
        produce_records(refusals.bootstrap, refusals.shuffled, [b"forged release"], producer_config=device,
                        client=client)
    with pytest.raises(KafkaWriteError, match=r"(?i)authoriz"):  # the raw topic is edge-only: no impersonation
        produce_records(refusals.bootstrap, refusals.raw, [b"an event in a victim's name"], producer_config=device,
                        client=client)


def test_esa_simulate_as_the_collector_without_rights_exits_in_one_line(secured: Secured,
                                                                        refusals: Chain) -> None:
    """Issue 34, A1: the collector may write the raw topic only; ``esa simulate`` also ensures the devices and
    reports topics, which the collector may neither create nor see: one line naming the topic and the refusal,
    exit 4, never a traceback (it was exit 1 with one)."""
    import sys

    argv = [sys.executable, "-m", "pipelines.cli", "simulate", "--bootstrap", refusals.bootstrap, "--spec",
            str(SPEC_PATH), "--clients", "40", "--seed", "3", "--raw_topic", refusals.raw, "--reports_topic",
            refusals.reports, "--keys_dir", str(secured.base / "sim-keys"),
            "--kafka_config", str(secured.config_file("collector"))]
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    lines = [line for line in refused.stderr.splitlines() if line.startswith("esa simulate")]
    assert refused.returncode == 4 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    # simulate enrols its devices through the devices topic first, then ensures the reports topic: the first
    # refusal is the one named
    assert len(lines) == 1 and "authorization failed" in lines[0].lower(), lines
    assert "cannot create the devices topic 'devices'" in lines[0] or f"cannot create topic {refusals.reports!r}" \
        in lines[0], lines
    assert "AUTHORIZATION_FAILED" in lines[0]
