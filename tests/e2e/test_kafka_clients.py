"""The two Kafka client libraries: settings translation, write failures, and the same estimates from either.

The Kafka IO semantics themselves run on both clients in test_kafkaio.py; this file covers what is
specific to having two: kafka-python setting names translated for librdkafka (and refused when they have no
equivalent), confluent-kafka's own failure paths, and the whole chain giving identical estimates.
"""

from __future__ import annotations

import socket
from pathlib import Path

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from pipelines.broker import LocalBroker
from pipelines.demo.population import synthesize
from pipelines.demo.simulate import produce_population
from pipelines.end_to_end import run
from pipelines.exit_codes import ConfigError
from pipelines.job_config import JobConfig, config_from_options
from tests.e2e.chain import enrol
from transforms.io.kafka.bounded import KafkaWriteError, WriteToKafka, ensure_topics, produce_records, read_topic
from transforms.io.kafka.config import CLIENTS, CONFLUENT, KAFKA_PYTHON, KafkaConfigError, to_librdkafka, validate
from transforms.spec import spec_from_dict
from transforms.state.estimates_store import read_estimates

pytestmark = pytest.mark.slow
N_CLIENTS = 2000


def test_kafka_python_names_become_librdkafka_names() -> None:
    given = {"security_protocol": "SASL_SSL", "ssl_cafile": "/ca.pem", "ssl_certfile": "/c.pem",
             "ssl_keyfile": "/k.pem", "ssl_password": "pw", "sasl_mechanism": "SCRAM-SHA-512",
             "sasl_plain_username": "u", "sasl_plain_password": "p", "ssl_check_hostname": "false",
             "request_timeout_ms": 2000, "acks": 1, "sasl_oauthbearer_method": "oidc", "fetch.max.bytes": 5}
    assert to_librdkafka(given) == {
        "security.protocol": "SASL_SSL", "ssl.ca.location": "/ca.pem", "ssl.certificate.location": "/c.pem",
        "ssl.key.location": "/k.pem", "ssl.key.password": "pw", "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "u", "sasl.password": "p", "ssl.endpoint.identification.algorithm": "none",
        "request.timeout.ms": 2000, "acks": "1", "sasl.oauthbearer.method": "oidc", "fetch.max.bytes": 5}
    assert to_librdkafka({"ssl_check_hostname": "True"}) == {"ssl.endpoint.identification.algorithm": "https"}


def test_untranslatable_keys_are_refused_by_name() -> None:
    with pytest.raises(KafkaConfigError, match=r"api_version, max_block_ms have no confluent-kafka"):
        to_librdkafka({"security_protocol": "SSL", "max_block_ms": 1, "api_version": "2.0"})
    with pytest.raises(KafkaConfigError, match="ssl_check_hostname: expected true or false"):
        to_librdkafka({"ssl_check_hostname": "maybe"})
    validate(KAFKA_PYTHON, {"max_block_ms": 1})  # kafka-python takes its own names as they are
    with pytest.raises(KafkaConfigError, match="unknown Kafka client 'java'"):
        validate("java", {})


def test_job_options_refuse_an_untranslatable_kafka_config(tmp_path: Path) -> None:
    from apache_beam.options.pipeline_options import PipelineOptions

    spec = tmp_path / "s.toml"
    spec.write_text('[analysis]\nname = "a"\nmetric = "m"\n[domain]\nsize = 4\n[mechanism]\nname = "grr"\n'
                    'epsilon = 1.0\n[window]\nsize_seconds = 3600\n', encoding="utf-8")
    settings = tmp_path / "kafka.properties"
    settings.write_text("security.protocol=SSL\nmax_block_ms=2000\n", encoding="utf-8")
    argv = [f"--spec={spec}", f"--output_dir={tmp_path / 'out'}", f"--kafka_config={settings}"]
    with pytest.raises(ConfigError, match=r"kafka\.properties: Kafka setting\(s\) max_block_ms have no"):
        config_from_options(PipelineOptions([*argv, "--kafka_client=confluent"]))
    config = config_from_options(PipelineOptions([*argv, "--kafka_client=kafka-python"]))
    assert config.kafka_client == KAFKA_PYTHON and config.kafka_config["security_protocol"] == "SSL"
    assert config_from_options(PipelineOptions(argv[:2])).kafka_client == CONFLUENT  # the default


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_confluent_unacknowledged_records_raise_kafka_write_error() -> None:
    bootstrap = f"127.0.0.1:{_closed_port()}"
    with pytest.raises(KafkaWriteError, match=r"producing to nowhere .* timed out"):
        produce_records(bootstrap, "nowhere", [b"x"] * 10, producer_config={"delivery_timeout_ms": 1500},
                        client=CONFLUENT)
    with pytest.raises(KafkaWriteError, match=r"3 record\(s\) not acknowledged within 1 s"):
        produce_records(bootstrap, "nowhere", [b"x"] * 3, flush_timeout_s=1.0, client=CONFLUENT)


def test_confluent_write_to_a_stopped_broker_fails_the_bundle(topic_name: str) -> None:
    with LocalBroker() as local:
        bootstrap = local.bootstrap
        ensure_topics(bootstrap, [topic_name], client=CONFLUENT)
        produce_records(bootstrap, topic_name, [b"before"], client=CONFLUENT)
        assert [r.value for r in read_topic(bootstrap, topic_name, client=CONFLUENT)] == [b"before"]
    p = beam.Pipeline(runner=FnApiRunner())
    _ = p | beam.Create([b"after"] * 5) | WriteToKafka(
        bootstrap, topic_name, producer_config={"delivery_timeout_ms": 1500}, client=CONFLUENT)
    with pytest.raises(Exception, match=rf"writing to {topic_name} on {bootstrap} failed: .*timed out"):
        p.run().wait_until_finish()


def _chain(base: Path, client: str) -> tuple[list[tuple], dict[str, list[tuple]], dict[str, int]]:
    """Produce the same population with ``client`` and run the whole chain on it with ``client``: (the raw
    topic's records, the estimates by column, the stage counters).

    Each client gets a broker of its own, so that topic names, partitions and offsets -- what the keyed
    randomness of the encoder is derived from -- are the same for both."""
    spec = spec_from_dict({
        "analysis": {"name": "clients", "metric": "clients"}, "domain": {"size": 8},
        "mechanism": {"name": "oue", "epsilon": 2.0}, "window": {"size_seconds": 3600},
        "crowd": {"epsilon": 1.0, "delta": 1e-6}, "privacy": {"delta": 1e-6},
    }, source="test")
    population = synthesize(spec, N_CLIENTS, seed=3)
    out = base / client
    enrol(out, population)
    topics = {"raw_topic": "raw", "reports_topic": "reports", "shuffled_topic": "shuffled"}
    with LocalBroker() as broker:
        produce_population(broker.bootstrap, spec, population, raw_topic=topics["raw_topic"],
                           reports_topic=topics["reports_topic"], client=client)
        raw = sorted((r.partition, r.offset, r.key, r.value)
                     for r in read_topic(broker.bootstrap, "raw", client=client))
        config = JobConfig(bootstrap=broker.bootstrap, specs=(spec,), out_dir=out, group_id="g", seed=5,
                           drain=True, kafka_client=client, **topics)
        summary = run(config)
    assert summary.balanced, summary.accounting
    table = read_estimates(summary.out_dir).to_pydict()
    order = np.argsort(table["item_index"])
    estimates = {c: [table[c][i] for i in order] for c in
                 ("item_index", "estimate", "stderr", "n_clients", "n_reports", "eps_local", "eps_central")}
    counters = {f"{stage}.{k}": v for stage, s in summary.stages.items() for k, v in s.accounting.items()}
    return raw, estimates, counters


def test_end_to_end_same_results_with_either_client(tmp_path: Path) -> None:
    """Same input bytes, same partitions and offsets, same accounting, and estimates that agree.

    Not bit-identical estimates: the shuffler deletes ~T uniformly chosen sets per crowd in the canonical
    order of their *sealed* bytes, and sealing draws fresh ephemeral keys (OS entropy) on every run, so two
    runs on one client already differ in which ~30 of the 2,000 devices are deleted. The estimates must then
    agree within the spread of two estimates: |e1 - e2| <= 4.5 sqrt(s1^2 + s2^2) per item (4.5: Bonferroni
    over 8 items at a family-wise false-alarm rate below 1e-4, treating the runs as independent, which
    overstates the spread since they share all but ~30 devices' randomized reports).
    """
    results = {client: _chain(tmp_path, client) for client in CLIENTS}
    (raw_ck, est_ck, count_ck), (raw_kp, est_kp, count_kp) = results[CONFLUENT], results[KAFKA_PYTHON]
    assert len(raw_ck) == N_CLIENTS and raw_ck == raw_kp  # librdkafka's murmur2 partitioner = kafka-python's
    assert count_ck == count_kp
    for column in ("item_index", "n_clients", "n_reports", "eps_local", "eps_central"):
        assert est_ck[column] == est_kp[column], column
    assert len(est_ck["estimate"]) == 8
    e1, e2 = np.asarray(est_ck["estimate"]), np.asarray(est_kp["estimate"])
    spread = np.hypot(np.asarray(est_ck["stderr"]), np.asarray(est_kp["stderr"]))
    assert np.all(np.abs(e1 - e2) <= 4.5 * spread), (e1, e2, spread)
