"""Beam's Java expansion service for KafkaIO (Beam 2.62.0), assembled from Maven, started and stopped by the project.

``--kafka_io xlang`` reads Kafka with Java's KafkaIO: the Python SDK asks an expansion service to turn
``apache_beam.io.kafka.ReadFromKafka`` into Java transforms. Beam's bundled
``beam-sdks-java-io-expansion-service`` jar is not served where this project runs; its parts are:
``beam-sdks-java-expansion-service`` and ``beam-sdks-java-io-kafka`` at 2.62.0, with ``kafka-clients`` (a
*provided* dependency of KafkaIO), ``jamm`` (provided by the Java harness, needed to run it in a JVM) and an
SLF4J binding. KafkaIO's ``io.confluent`` dependencies (the Schema Registry Avro serializers, unused here) live
on packages.confluent.io, which Maven Central does not mirror: they are excluded, or the resolution fails
("Unknown host packages.confluent.io"). The jars are fetched into the cache once
(``pipelines.artifacts.maven_classpath``: locked, renamed into place, no network afterwards) and
``LoopbackExpansionService.java`` (the service bound to 127.0.0.1 only) is compiled against them once.

The Java transforms run in Beam's EMBEDDED environment: the Flink runner runs the Java SDK harness inside its
own JVM, so the job server must have the same jars on its class path (``JobServer(..., extra_libs=kafka_io_libs())``;
the Flink runner ships its class path with the job). Process shape: the same watchdog as the job server's
(``pipelines.flink_job_server``): the JVM dies with its watchdog (``PR_SET_PDEATHSIG``), the watchdog stops
it when its owner's pipe closes. The service is only needed while a pipeline is built (expansion happens
when the transform is applied); one per process is kept and stopped at exit.
"""

from __future__ import annotations

import argparse
import atexit
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

from pipelines.artifacts import compiled_java, maven_classpath
from pipelines.flink_job_server import HOST, JAVA_OPTS, _readline, stop_watchdog, watch_jvm

BEAM_VERSION = "2.62.0"
KAFKA_CLIENTS = "3.9.1"  # KafkaIO supports kafka-clients 2.x-3.x; this one speaks to Kafka 4 brokers
COORDINATES = (f"org.apache.beam:beam-sdks-java-expansion-service:{BEAM_VERSION}",
               f"org.apache.beam:beam-sdks-java-io-kafka:{BEAM_VERSION}",
               f"org.apache.kafka:kafka-clients:{KAFKA_CLIENTS}",
               "com.github.jbellis:jamm:0.4.0",  # the embedded Java harness measures elements with it
               "org.slf4j:slf4j-simple:1.7.30")
EXCLUSIONS = ("io.confluent:*",)
MAIN = "LoopbackExpansionService"
SOURCE = Path(__file__).resolve().parent / "java" / f"{MAIN}.java"
STARTED = re.compile(r"ExpansionService started on (\S+)")
START_TIMEOUT_S = 300.0


def kafka_io_libs() -> Path:
    """The directory of KafkaIO's jars (fetched on first use): the job server adds them to its class path."""
    return maven_classpath(f"kafka-expansion-{BEAM_VERSION}", COORDINATES, exclusions=EXCLUSIONS)


def classpath() -> str:
    libs = kafka_io_libs()
    classes = compiled_java(SOURCE, libs, f"kafka-expansion-launcher-{BEAM_VERSION}")
    return f"{classes}{os.pathsep}{libs}{os.sep}*"


def java_command() -> list[str]:
    java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else "java"
    return [java, *JAVA_OPTS, "-cp", classpath(), MAIN, HOST, "0", "--defaultEnvironmentType=EMBEDDED"]


class ExpansionService:
    """One expansion service owned by this process: ``start() -> "127.0.0.1:PORT"``, ``stop()``."""

    def __init__(self) -> None:
        self.endpoint = ""
        self.jvm_pid = 0
        self._watchdog: subprocess.Popen[str] | None = None

    def start(self, timeout_s: float = START_TIMEOUT_S) -> str:
        classpath()  # fetch/compile here, so a missing artifact is an ArtifactUnavailableError of this process
        self._watchdog = subprocess.Popen(
            [sys.executable, "-m", "pipelines.kafka_expansion", "--watch-stdin"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(SOURCE.parents[2]),
                                                                          os.environ.get("PYTHONPATH")]))))
        line = _readline(self._watchdog, timeout_s)
        found = re.match(r"EXPANSION_ENDPOINT (\S+) (\d+)$", line)
        if not found:
            error = (self._watchdog.stderr.read() if self._watchdog.poll() is not None and self._watchdog.stderr
                     else "") or line
            self.stop()
            raise RuntimeError(f"the KafkaIO expansion service did not start: {error.strip()[-400:] or 'no output'}")
        self.endpoint, self.jvm_pid = found.group(1), int(found.group(2))
        return self.endpoint

    @property
    def watchdog_pid(self) -> int:
        return self._watchdog.pid if self._watchdog else 0

    def alive(self) -> bool:
        return self._watchdog is not None and self._watchdog.poll() is None

    def stop(self, grace_s: float = 25.0) -> None:
        watchdog, self._watchdog = self._watchdog, None
        stop_watchdog(watchdog, grace_s)


_SHARED: list[ExpansionService] = []
_LOCK = threading.Lock()


def shared_expansion_service() -> ExpansionService:
    """This process's expansion service, started on first use and stopped at exit."""
    with _LOCK:
        if _SHARED and _SHARED[0].alive():
            return _SHARED[0]
        service = ExpansionService()
        service.start()
        if not _SHARED:
            atexit.register(stop_shared_expansion_service)
        _SHARED[:] = [service]
        return service


def stop_shared_expansion_service() -> None:
    with _LOCK:
        for service in _SHARED:
            service.stop()
        _SHARED.clear()


def serve(watch_stdin: bool) -> int:
    """The watchdog: run the JVM until the owner's pipe closes, a signal comes, or the JVM exits."""
    import tempfile

    log_path = Path(tempfile.mkstemp(prefix="esa-kafka-expansion-", suffix=".log")[1])

    def failure(_jvm: subprocess.Popen[bytes], text: str) -> str:
        lines = text.strip().splitlines()
        return f"the expansion service JVM did not start: {lines[-1] if lines else 'no output'} (log: {log_path})"

    code = watch_jvm(java_command(), log_path, STARTED, "EXPANSION_ENDPOINT", failure, watch_stdin)
    if code == 0:
        log_path.unlink(missing_ok=True)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kafka-expansion", description=__doc__.split("\n\n")[0])
    parser.add_argument("--watch-stdin", action="store_true", help="stop when stdin reaches end of file")
    return serve(parser.parse_args(argv).watch_stdin)


if __name__ == "__main__":
    sys.exit(main())
