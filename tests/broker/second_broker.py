"""A second Apache Kafka node (broker only) joining a `LocalBroker`'s KRaft quorum, for leadership tests.

Why: on one node every partition is led by that node, so "no leader" only lasts the moment after a restart.
A partition placed on a second broker loses its leader, deterministically and for as long as a test wants,
when that broker is killed, and gets it back when it starts again: the case a job meets in production on
every broker restart and leader election.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from pipelines.broker import LocalBroker, free_loopback_port
from pipelines.broker.jars import java_binary, kafka_jars
from pipelines.broker.local import parent_death_hook
from pipelines.broker.properties import LOG4J2_YAML

NODE_ID = 2


def _properties(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line and not line.startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


class SecondBroker:
    """Node 2 of ``first``'s cluster (plaintext only), data under ``directory``."""

    def __init__(self, first: LocalBroker, directory: Path) -> None:
        assert first.dir is not None and first.security is None
        self.first, self.dir = first, directory
        self.port = free_loopback_port()
        self._proc: subprocess.Popen[bytes] | None = None

    def _config(self) -> Path:
        assert self.first.dir is not None
        quorum = _properties(self.first.dir / "server.properties")["controller.quorum.voters"]
        cluster = _properties(self.first.dir / "kafka-logs" / "meta.properties")["cluster.id"]
        self.dir.mkdir(parents=True, exist_ok=True)
        config = self.dir / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in {
            "process.roles": "broker", "node.id": str(NODE_ID), "controller.quorum.voters": quorum,
            "controller.listener.names": "CONTROLLER", "log.dirs": str(self.dir / "kafka-logs"),
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port}", "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "offsets.topic.replication.factor": "1", "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1", "controlled.shutdown.enable": "false",
        }.items()))
        (self.dir / "log4j2.yaml").write_text(LOG4J2_YAML)
        if not (self.dir / "kafka-logs" / "meta.properties").exists():
            subprocess.run([java_binary(), "-cp", f"{kafka_jars()}/*", "kafka.tools.StorageTool", "format",
                            "--cluster-id", cluster, "--config", str(config), "--ignore-formatted"],
                           check=True, capture_output=True, timeout=180)
        return config

    def start(self, wait_s: float = 120.0) -> SecondBroker:
        """Start node 2 and wait until the cluster's metadata lists it."""
        from confluent_kafka.admin import AdminClient

        config = self._config()
        log = (self.dir / "broker.log").open("ab")
        self._proc = subprocess.Popen(
            [java_binary(), "-Xmx384m", "-Xms64m", f"-Dlog4j2.configurationFile={self.dir / 'log4j2.yaml'}",
             "-cp", f"{kafka_jars()}/*", "kafka.Kafka", str(config)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir, start_new_session=True,
            preexec_fn=parent_death_hook())  # a killed test leaves no JVM behind
        log.close()
        admin = AdminClient({"bootstrap.servers": self.first.bootstrap, "log_level": 0})
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"broker 2 exited: {(self.dir / 'broker.log').read_text()[-2000:]}")
            if NODE_ID in admin.list_topics(timeout=5).brokers:
                return self
            time.sleep(0.2)
        raise RuntimeError("broker 2 did not join the cluster")

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait()
        self._proc = None
