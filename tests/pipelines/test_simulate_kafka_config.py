"""`esa simulate --kafka_config FILE`: a bad file is refused as the jobs refuse it, a good one reaches every client.

The refusal is compared with what `esa encode` prints for the same file (same exit code, same one-line
message but for the command's name), before any Kafka client or key exists. The settings are checked on the
real client objects: the Kafka libraries' producer and admin classes are wrapped to record the configuration
each real instance was built with (kafka-python's resolved ``config``; the dict librdkafka was handed), while
the records still go to a real local broker and are read back.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from pipelines import cli, cli_parser
from pipelines.exit_codes import ExitCode
from transforms.io.kafka.bounded import read_topic
from transforms.io.kafka.config import CONFLUENT, KAFKA_PYTHON

SPEC = Path(cli_parser.DEFAULT_SPEC)
CLOSED = "127.0.0.1:1"  # nothing listens: a command that got as far as Kafka would exit 4, not 3


def _one_error_line(capsys: pytest.CaptureFixture) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


BAD_FILES = {  # case -> (file text or None: no file, what the one line must say after the file name)
    "untranslatable key": ("security_protocol=PLAINTEXT\nmax_block_ms=2000\n",
                           ": Kafka setting(s) max_block_ms have no confluent-kafka (librdkafka) equivalent"),
    "not key=value": ("# TLS\nsecurity_protocol=PLAINTEXT\nssl_cafile\n", ":3: expected key=value, got 'ssl_cafile'"),
    "missing file": (None, ": cannot read it: No such file or directory"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_kafka_config_is_refused_as_the_jobs_refuse_it(tmp_path: Path, capsys, case: str) -> None:
    settings = tmp_path / "kafka.properties"
    text, reason = BAD_FILES[case]
    if text is not None:
        settings.write_text(text, encoding="utf-8")
    keys = tmp_path / "keys"
    code = cli.main(["simulate", "--bootstrap", CLOSED, "--clients", "10", "--keys_dir", str(keys),
                     "--kafka_config", str(settings)])
    simulate_line = _one_error_line(capsys)
    job_code = cli.main(["encode", "--spec", str(SPEC), "--output_dir", str(tmp_path / "out"),
                         "--kafka_bootstrap", CLOSED, "--kafka_config", str(settings)])
    job_line = _one_error_line(capsys)
    assert code == job_code == int(ExitCode.CONFIG)
    assert simulate_line.startswith(f"esa simulate: error: --kafka_config {settings}{reason}")
    assert simulate_line.removeprefix("esa simulate: ") == job_line.removeprefix("esa encode: ")
    assert not keys.exists()  # refused before any device was enrolled


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """(kind, configuration) of every real producer and admin client either library builds during the test."""
    import confluent_kafka
    import confluent_kafka.admin
    import kafka

    seen: list[tuple[str, dict[str, Any]]] = []

    real_producer, real_admin_init = confluent_kafka.Producer, confluent_kafka.admin.AdminClient.__init__

    def rd_producer(config: dict[str, Any]) -> Any:  # a C type: wrapped by a factory
        seen.append(("producer", dict(config)))
        return real_producer(config)

    def rd_admin_init(self: Any, config: dict[str, Any], **kwargs: Any) -> None:  # its __init__ names its class
        seen.append(("admin", dict(config)))
        real_admin_init(self, config, **kwargs)

    class KpProducer(kafka.KafkaProducer):
        def __init__(self, **config: Any) -> None:
            super().__init__(**config)
            seen.append(("producer", dict(self.config)))

    class KpAdmin(kafka.KafkaAdminClient):
        def __init__(self, **config: Any) -> None:
            super().__init__(**config)
            seen.append(("admin", dict(self.config)))

    monkeypatch.setattr(confluent_kafka, "Producer", rd_producer)
    monkeypatch.setattr(confluent_kafka.admin.AdminClient, "__init__", rd_admin_init)
    monkeypatch.setattr(kafka, "KafkaProducer", KpProducer)
    monkeypatch.setattr(kafka, "KafkaAdminClient", KpAdmin)
    return seen


# (client, --devices?): raw events with bad records (three producers), or device-made message sets (one).
CASES = [(CONFLUENT, False), (KAFKA_PYTHON, False), (CONFLUENT, True)]


@pytest.mark.slow
@pytest.mark.parametrize(("client", "devices"), CASES)
def test_kafka_config_reaches_every_client(broker, tmp_path: Path, topic_name: str, capsys, client: str,
                                           devices: bool, built: list[tuple[str, dict[str, Any]]]) -> None:
    client_id = f"esa-sim-{uuid.uuid4().hex[:8]}"
    settings = tmp_path / "kafka.properties"
    own = "max_block_ms=4321\n" if client == KAFKA_PYTHON else ""  # a kafka-python name librdkafka has not
    settings.write_text(f"client_id={client_id}\nsecurity_protocol=PLAINTEXT\nlinger.ms=7\n{own}", encoding="utf-8")
    raw, reports = f"{topic_name}-raw", f"{topic_name}-rep"
    args = ["simulate", "--bootstrap", broker.bootstrap, "--clients", "40", "--raw_topic", raw, "--reports_topic",
            reports, "--seed", "5", "--keys_dir", str(tmp_path / "keys"), "--kafka_client", client,
            "--kafka_config", str(settings)]
    args += ["--devices", str(tmp_path / "devices")] if devices else ["--bad_per_kind", "1"]
    assert cli.main(args) == 0
    produced = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["produced"]

    kinds = sorted(kind for kind, _ in built)
    # the reachability check, the devices topic's and the others' creation; enrolments, raw events, bad raw, bad
    # reports (or the devices' sets)
    assert kinds == ["admin", "admin", "admin"] + ["producer"] * (2 if devices else 4)
    names = ({"client": "client.id", "protocol": "security.protocol", "linger": "linger.ms"} if client == CONFLUENT
             else {"client": "client_id", "protocol": "security_protocol", "linger": "linger_ms"})
    for kind, config in built:
        assert config[names["protocol"]] == "PLAINTEXT", (kind, config)
        if kind == "producer":
            assert (config[names["client"]], config[names["linger"]]) == (client_id, 7), config
            assert client == CONFLUENT or config["max_block_ms"] == 4321
    admin_id = "client.id" if client == CONFLUENT else "client_id"  # the admin clients are named as configured too
    assert [config[admin_id] for kind, config in built if kind == "admin"] == [client_id] * 3

    expected = {reports: 40, "refused_by_device_budget": 0} if devices else {raw: 43, reports: 3}
    assert produced == expected
    other = KAFKA_PYTHON if client == CONFLUENT else CONFLUENT
    for topic in (reports,) if devices else (raw, reports):
        assert len(read_topic(broker.bootstrap, topic, client=other)) == expected[topic]


def test_the_flag_is_listed_in_simulate_help(capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        cli.main(["simulate", "--help"])
    assert stop.value.code == 0
    assert "--kafka_config FILE" in capsys.readouterr().out
