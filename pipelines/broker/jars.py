"""Apache Kafka's own jars, fetched once with Maven into a cache outside the repository.

Why Maven and not a release tarball: the machines this project runs on reach Maven Central but not Apache's
download mirrors, and `kafka_2.13` with its runtime dependencies is exactly the broker's class path. The
first call resolves them (about 45 MB) into ``<cache>/kafka-<version>/libs``; every later call finds the
completed directory and touches no network. A lock serializes concurrent first calls (parallel test
sessions, a demo beside a test run) and the directory appears atomically, so a half-written cache is never
used.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from pipelines.broker.errors import BrokerError

_log = logging.getLogger(__name__)

#: The Apache Kafka release the project starts (KRaft, combined broker + controller). Pinned: it resolved
#: from Maven Central here with every runtime dependency; bump it on purpose, with the broker tests.
KAFKA_VERSION = "4.1.1"
#: Kafka logs through SLF4J 1.7; without a binding every broker line is dropped.
LOG4J_VERSION = "2.24.3"
_COMPLETE = "COMPLETE"
_MIN_JAVA = 17

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>esa-telemetry</groupId><artifactId>kafka-broker-classpath</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
      <version>{kafka}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId>
      <version>{log4j}</version></dependency>
  </dependencies>
</project>
"""


def cache_root() -> Path:
    """``$ESA_CACHE_DIR``, else ``$XDG_CACHE_HOME/esa-telemetry``, else ``~/.cache/esa-telemetry``."""
    if os.environ.get("ESA_CACHE_DIR"):
        return Path(os.environ["ESA_CACHE_DIR"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "esa-telemetry"


def java_binary() -> str:
    """``$JAVA_HOME/bin/java`` or ``java`` on PATH, checked to be Java 17 or newer (Kafka 4 needs it)."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home and (Path(home) / "bin" / "java").exists() else shutil.which("java")
    if java is None:
        raise BrokerError("Java is not installed (no `java` on PATH and no JAVA_HOME): Apache Kafka needs Java "
                          f"{_MIN_JAVA} or newer, e.g. `apt-get install openjdk-17-jre-headless`")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BrokerError(f"cannot run {java} -version: {exc}") from None
    found = re.search(r'version "(\d+)', out.stderr + out.stdout)
    if found is None or int(found.group(1)) < _MIN_JAVA:
        seen = (out.stderr or out.stdout).splitlines()[:1]
        raise BrokerError(f"Apache Kafka needs Java {_MIN_JAVA} or newer; {java} is {seen[0] if seen else 'unknown'}")
    return java


def kafka_jars(version: str = KAFKA_VERSION, root: Path | None = None) -> Path:
    """The directory holding Kafka ``version``'s class path; fetched with ``mvn`` on the first call only."""
    root = cache_root() if root is None else root
    target = root / f"kafka-{version}"
    if (target / _COMPLETE).exists():
        return target / "libs"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BrokerError(f"cannot create the jar cache {root}: {exc.strerror}") from None
    with (root / f"kafka-{version}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / _COMPLETE).exists():
            _fetch(version, root, target)
    return target / "libs"


def _fetch(version: str, root: Path, target: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError(f"Maven (`mvn`) is not on PATH; it is needed once to fetch Apache Kafka {version}'s jars "
                          f"into {target} (e.g. `apt-get install maven`)")
    work = Path(tempfile.mkdtemp(prefix=f".kafka-{version}-", dir=root))
    try:
        (work / "pom.xml").write_text(_POM.format(kafka=version, log4j=LOG4J_VERSION))
        t0 = time.monotonic()
        _log.warning("fetching Apache Kafka %s's jars with Maven into %s (once; about 45 MB)", version, target)
        cmd = [mvn, "-B", "-q", "-f", str(work / "pom.xml"), "dependency:copy-dependencies",
               f"-DoutputDirectory={work / 'libs'}", "-DincludeScope=runtime"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired:
            raise BrokerError(f"mvn did not fetch Apache Kafka {version} within 15 minutes") from None
        if done.returncode != 0:
            errors = [line.removeprefix("[ERROR]").strip() for line in (done.stdout + done.stderr).splitlines()
                      if line.startswith("[ERROR]") and line.removeprefix("[ERROR]").strip()]
            cause = errors[0][:300] if errors else f"exit {done.returncode}"
            raise BrokerError(f"mvn could not fetch Apache Kafka {version}'s jars into {target} (offline, or the "
                              f"registry refused them; nothing is cached yet): {cause}")
        jars = sorted(p.name for p in (work / "libs").glob("*.jar"))
        if f"kafka_2.13-{version}.jar" not in jars:
            raise BrokerError(f"mvn finished but kafka_2.13-{version}.jar is missing from {work / 'libs'}")
        (work / _COMPLETE).write_text("\n".join(jars) + "\n")
        (work / "pom.xml").unlink()
        os.rename(work, target)
        _log.warning("fetched %d jars in %.1f s", len(jars), time.monotonic() - t0)
    finally:
        shutil.rmtree(work, ignore_errors=True)
