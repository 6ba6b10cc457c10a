"""Runner artifacts fetched once into a cache outside the repository, then used offline.

Three kinds, each from its own registry through its ordinary client: Maven jars (``mvn dependency:get``; Beam's
own downloader uses plain HTTP to a fixed host, which we cannot rely on), Go binaries (``go install`` of a
module version into the cache's ``bin/``) and PyPI source distributions unpacked into a directory (``pip
download``; never installed beside Beam: ``apache-flink`` pins an old Beam), all in ``cache_dir()``. What is
fetched as a directory appears atomically (a locked fetch into a work directory, renamed when complete). A
fetch that fails raises ``ArtifactUnavailableError`` with one line naming what was asked for and the
registry's own answer, so an operator can see whether to retry or to bring the file.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from pipelines.broker.jars import cache_root

FETCH_TIMEOUT_S = 900  # a 230 MB sdist, 150 MB of jars or a Go build on a slow machine
COMPLETE = ".complete"  # written last into a work directory that is then renamed into place
_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>
<groupId>esa-telemetry</groupId><artifactId>{name}</artifactId><version>1</version><packaging>pom</packaging>
<dependencies>{dependencies}</dependencies></project>
"""


class ArtifactUnavailableError(RuntimeError):
    """A registry refused (or could not serve) an artifact the requested runner needs."""


def cache_dir() -> Path:
    """The broker's cache directory (`pipelines.broker.jars.cache_root`): one place for every fetched artifact."""
    return cache_root()


def _last_error(output: str) -> str:
    """The registry's own words: the first line that says what went wrong, else the last line."""
    output = re.sub(r"\x1b\[[0-9;]*m", "", output)
    found = re.search(r"Could not find artifact [^\n]*", output)  # Maven: the artifact and the repository asked
    if found:
        return found.group(0).strip()[:400]
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for ln in lines:
        if "[ERROR]" in ln or ln.lower().startswith(("error", "go: ")) or "not found" in ln.lower():
            return ln.replace("[ERROR] ", "")[:400]
    return lines[-1][:400] if lines else "no output"


def maven_jar(coordinates: str) -> Path:
    """``group:artifact:version`` as a jar in the cache (fetched with ``mvn`` the first time, under a lock: two
    test workers fetching at once would run two ``mvn`` into one local repository and copy into one file)."""
    group, artifact, version = coordinates.split(":")
    target = cache_dir() / "maven" / f"{artifact}-{version}.jar"
    if target.is_file():
        return target
    if shutil.which("mvn") is None:
        raise ArtifactUnavailableError(f"{coordinates}: not in {target.parent} and no mvn on PATH to fetch it")
    with _locked(f"maven-{artifact}-{version}"):
        if target.is_file():  # fetched by whoever held the lock before us
            return target
        # -U: a refusal Maven cached earlier is asked again (the artifact may be served by now)
        done = subprocess.run(["mvn", "-q", "-B", "-U", "dependency:get", "-Dtransitive=false",
                               f"-Dartifact={coordinates}"], capture_output=True, text=True, timeout=FETCH_TIMEOUT_S)
        local = Path.home() / ".m2" / "repository" / Path(*group.split(".")) / artifact / version
        local = local / f"{artifact}-{version}.jar"
        if done.returncode != 0 or not local.is_file():
            why = _last_error(done.stdout + done.stderr)
            raise ArtifactUnavailableError(f"{coordinates} could not be fetched with mvn: {why}")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".part")
        shutil.copyfile(local, partial)
        partial.replace(target)
    return target


def go_binary(package: str, version: str, name: str) -> Path:
    """``go install package@version`` into the cache as ``bin/NAME-VERSION`` (built the first time).

    Locked like the other fetches: two test workers (pytest-xdist) or a demo beside a test session asking on a
    cold cache would otherwise build into the same ``GOBIN`` at once, and one's rename would take the other's
    binary from under it."""
    target = cache_dir() / "bin" / f"{name}-{version.lstrip('v')}"
    if target.is_file():
        return target
    if shutil.which("go") is None:
        raise ArtifactUnavailableError(f"{package}@{version}: not in {target.parent} and no go on PATH to build it")
    with _locked(f"go-{name}"):
        if target.is_file():  # built by whoever held the lock before us
            return target
        build = cache_dir() / "gobuild"
        build.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, GOBIN=str(build))
        done = subprocess.run(["go", "install", f"{package}@{version}"], capture_output=True, text=True, env=env,
                              timeout=FETCH_TIMEOUT_S)
        built = build / package.rsplit("/", 1)[1]
        if done.returncode != 0 or not built.is_file():
            why = _last_error(done.stderr + done.stdout)
            raise ArtifactUnavailableError(f"go install {package}@{version} failed: {why}")
        target.parent.mkdir(parents=True, exist_ok=True)
        built.replace(target)
    return target


@contextmanager
def _locked(name: str) -> Iterator[Path]:
    """An exclusive lock on ``<cache>/NAME.lock``: concurrent first fetches (test sessions, a demo) serialize."""
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    with (root / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield root


def _publish(work: Path, target: Path) -> None:
    """Rename a completed work directory into place: readers see all of it or nothing."""
    (work / COMPLETE).write_text("complete\n")
    os.rename(work, target)


def maven_classpath(name: str, coordinates: Sequence[str], exclusions: Sequence[str] = ()) -> Path:
    """Every jar of ``coordinates`` and of their runtime dependencies in ``<cache>/NAME/libs``.

    ``exclusions`` (``group:artifact``, ``*`` allowed) are left out of every coordinate's dependencies: a
    dependency served only by another repository (``io.confluent:*``) would fail the whole resolution.

    Fetched with ``mvn dependency:copy-dependencies`` on a one-pom project the first time only (as Kafka's jars
    are: ``pipelines.broker.jars``), under a lock, into a work directory renamed into place when complete; every
    later call finds the directory and touches no network."""
    target = cache_dir() / name
    if (target / COMPLETE).is_file():
        return target / "libs"
    with _locked(name) as root:
        if (target / COMPLETE).is_file():
            return target / "libs"
        if shutil.which("mvn") is None:
            raise ArtifactUnavailableError(f"{', '.join(coordinates)}: not in {target}; no mvn on PATH to fetch them")
        work = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
        try:
            excluded = "".join(f"<exclusion><groupId>{g}</groupId><artifactId>{a}</artifactId></exclusion>"
                               for g, a in (e.split(":") for e in exclusions))
            excluded = f"<exclusions>{excluded}</exclusions>" if excluded else ""
            deps = "".join(f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version>"
                           f"{excluded}</dependency>" for g, a, v in (c.split(":") for c in coordinates))
            (work / "pom.xml").write_text(_POM.format(name=name, dependencies=deps))
            done = subprocess.run(["mvn", "-B", "-q", "-f", str(work / "pom.xml"), "dependency:copy-dependencies",
                                   f"-DoutputDirectory={work / 'libs'}", "-DincludeScope=runtime"],
                                  capture_output=True, text=True, timeout=FETCH_TIMEOUT_S)
            if done.returncode != 0 or not any((work / "libs").glob("*.jar")):
                why = _last_error(done.stdout + done.stderr)
                raise ArtifactUnavailableError(f"{', '.join(coordinates)} could not be fetched with mvn: {why}")
            _publish(work, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target / "libs"


def unpacked_sdist(requirement: str, member: str, directory: str) -> Path:
    """The ``MEMBER`` folder of PyPI's source distribution of ``REQUIREMENT`` (``pip download --no-binary``),
    unpacked as ``<cache>/DIRECTORY`` (never installed); locked and renamed into place like ``maven_classpath``."""
    target = cache_dir() / directory
    if (target / COMPLETE).is_file():
        return target
    with _locked(directory) as root:
        if (target / COMPLETE).is_file():
            return target
        sdists = root / "sdists"
        sdists.mkdir(parents=True, exist_ok=True)
        name, _, version = requirement.partition("==")
        pattern = f"{name}-{version}.tar.gz"
        if not (sdists / pattern).is_file():
            done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary=:all:",
                                   "-d", str(sdists), requirement], capture_output=True, text=True,
                                  timeout=FETCH_TIMEOUT_S)
            if done.returncode != 0 or not (sdists / pattern).is_file():
                why = _last_error(done.stderr + done.stdout)
                raise ArtifactUnavailableError(f"pip download {requirement} failed: {why}")
        work = Path(tempfile.mkdtemp(prefix=f".{directory}-", dir=root))
        try:
            prefix = f"{name}-{version}/{member.strip('/')}/"
            with tarfile.open(sdists / pattern) as archive:
                members = [m for m in archive.getmembers() if m.name.startswith(prefix)]
                for m in members:
                    m.name = m.name[len(prefix):]
                archive.extractall(work, members=[m for m in members if m.name], filter="data")
            _publish(work, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


def compiled_java(source: Path, classpath: Path, directory: str) -> Path:
    """``javac`` of one source file against ``classpath/*``, as the jar ``<cache>/DIRECTORY-<sha of the
    source>/<name>.jar`` (a jar, not a class folder: a Flink job server ships its class path to the cluster)."""
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    target = cache_dir() / f"{directory}-{digest}"
    jar = target / f"{source.stem}.jar"
    if (target / COMPLETE).is_file():
        return jar
    with _locked(directory) as root:
        if (target / COMPLETE).is_file():
            return jar
        if shutil.which("javac") is None:
            raise ArtifactUnavailableError(f"{source.name}: no javac on PATH to compile it (a JDK 17+ is needed once)")
        work = Path(tempfile.mkdtemp(prefix=f".{directory}-", dir=root))
        try:
            classes = work / "classes"
            done = subprocess.run(["javac", "-nowarn", "-d", str(classes), "-cp", f"{classpath}/*", str(source)],
                                  capture_output=True, text=True, timeout=FETCH_TIMEOUT_S)
            if done.returncode != 0:
                raise ArtifactUnavailableError(f"javac {source.name} failed: {_last_error(done.stderr)}")
            with zipfile.ZipFile(work / jar.name, "w", zipfile.ZIP_DEFLATED) as archive:
                for path in sorted(classes.rglob("*.class")):
                    archive.write(path, path.relative_to(classes).as_posix())
            shutil.rmtree(classes)
            _publish(work, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return jar
