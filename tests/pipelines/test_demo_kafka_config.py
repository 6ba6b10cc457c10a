"""`esa demo --kafka_client/--kafka_config`: a bad file is refused as the jobs refuse it, before anything is made;
a good one reaches the simulator's producers and the jobs' clients of the chosen library on a real broker."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from pipelines import cli
from pipelines.exit_codes import ExitCode
from transforms.io.kafka.config import KAFKA_PYTHON

CLOSED = "127.0.0.1:1"  # nothing listens there


def test_a_bad_kafka_config_is_refused_before_anything_is_made(tmp_path: Path, capsys) -> None:
    settings = tmp_path / "kafka.properties"
    settings.write_text("security_protocol=PLAINTEXT\nssl_cafile\n", encoding="utf-8")
    out = tmp_path / "demo"
    code = cli.main(["demo", "--bootstrap", CLOSED, "--clients", "10", "--out", str(out),
                     "--kafka_config", str(settings)])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == int(ExitCode.CONFIG)
    assert lines == [f"esa demo: error: --kafka_config {settings}:2: expected key=value, got 'ssl_cafile'"]
    assert not out.exists() and not Path(f"{out}.keys").exists()


@pytest.mark.slow
def test_the_settings_reach_the_simulator_and_the_jobs(broker, tmp_path: Path, monkeypatch) -> None:
    import kafka

    seen: list[tuple[str, dict[str, Any]]] = []

    class Producer(kafka.KafkaProducer):
        def __init__(self, **config: Any) -> None:
            super().__init__(**config)
            seen.append(("producer", dict(self.config)))

    class Consumer(kafka.KafkaConsumer):
        def __init__(self, *topics: Any, **config: Any) -> None:
            super().__init__(*topics, **config)
            seen.append(("consumer", dict(self.config)))

    monkeypatch.setattr(kafka, "KafkaProducer", Producer)
    monkeypatch.setattr(kafka, "KafkaConsumer", Consumer)
    client_id = f"esa-demo-{uuid.uuid4().hex[:8]}"
    settings = tmp_path / "kafka.properties"
    settings.write_text(f"client_id={client_id}\nsecurity_protocol=PLAINTEXT\n", encoding="utf-8")
    out = tmp_path / "demo"
    code = cli.main(["demo", "--bootstrap", broker.bootstrap, "--clients", "300", "--out", str(out), "--seed", "3",
                     "--kafka_client", KAFKA_PYTHON, "--kafka_config", str(settings)])
    assert code == 0
    assert (out / "summary.json").exists()
    kinds = {kind for kind, _ in seen}
    assert kinds == {"producer", "consumer"}  # the simulator's and the jobs' clients were kafka-python's
    assert all(config["client_id"] == client_id for _, config in seen), seen
