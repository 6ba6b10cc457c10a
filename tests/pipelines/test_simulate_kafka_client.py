"""`esa simulate --kafka_client`: either client creates the topics and produces every record (broker test).

The client factories are wrapped to record which library was asked for, so a flag that is parsed but not
passed on (the simulation silently producing with the default client) fails; the records are then read back
and counted.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipelines import cli
from transforms.io.kafka import bounded as kafkaio
from transforms.io.kafka import writer as kafka_writer
from transforms.io.kafka.bounded import read_topic
from transforms.io.kafka.config import CLIENTS, CONFLUENT, KAFKA_PYTHON

pytestmark = pytest.mark.slow


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(what, client) of every producer (made by transforms.io.kafka.writer, the one module that writes to
    Kafka) and every topic creation (transforms.io.kafka.bounded)."""
    calls: list[tuple[str, str]] = []

    def spy(what: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(client: str, *args: Any, **kwargs: Any) -> Any:
            calls.append((what, client))
            return real(client, *args, **kwargs)
        return wrapped

    monkeypatch.setattr(kafka_writer, "producer", spy("produce", kafka_writer.producer))
    monkeypatch.setattr(kafkaio, "create_topics", spy("create", kafkaio.create_topics))
    return calls


def simulate(capsys: pytest.CaptureFixture, *args: str) -> dict[str, int]:
    assert cli.main(["simulate", *args]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["produced"]


@pytest.mark.parametrize("client", CLIENTS)
def test_simulate_produces_with_the_chosen_client(broker, tmp_path: Path, topic_name: str, client: str,
                                                  asked: list[tuple[str, str]], capsys) -> None:
    raw, reports = f"{topic_name}-raw", f"{topic_name}-rep"
    produced = simulate(capsys, "--bootstrap", broker.bootstrap, "--clients", "300", "--raw_topic", raw,
                        "--reports_topic", reports, "--bad_per_kind", "1", "--seed", "4",
                        "--keys_dir", str(tmp_path / "keys"), "--kafka_client", client)
    # 300 events + 3 bad raw records (not Avro, out of domain, a duplicate); 3 bad reports.
    assert produced == {raw: 303, reports: 3}
    assert set(asked) == {("create", client), ("produce", client)}
    other = KAFKA_PYTHON if client == CONFLUENT else CONFLUENT  # read back with the other library
    assert len(read_topic(broker.bootstrap, raw, client=other)) == 303
    assert len(read_topic(broker.bootstrap, reports, client=other)) == 3


def test_simulated_devices_produce_with_the_chosen_client(broker, tmp_path: Path, topic_name: str,
                                                          asked: list[tuple[str, str]], capsys) -> None:
    produced = simulate(capsys, "--bootstrap", broker.bootstrap, "--clients", "20", "--raw_topic", f"{topic_name}-raw",
                        "--reports_topic", f"{topic_name}-rep", "--devices", str(tmp_path / "devices"),
                        "--seed", "4", "--keys_dir", str(tmp_path / "keys"), "--kafka_client", KAFKA_PYTHON)
    assert produced == {f"{topic_name}-rep": 20, "refused_by_device_budget": 0}
    assert set(asked) == {("create", KAFKA_PYTHON), ("produce", KAFKA_PYTHON)}
    assert len(read_topic(broker.bootstrap, f"{topic_name}-rep", client=CONFLUENT)) == 20


def test_simulate_refuses_an_unknown_client(capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        cli.main(["simulate", "--bootstrap", "h:1", "--kafka_client", "java"])
    assert stop.value.code == 2 and "invalid choice: 'java'" in capsys.readouterr().err
