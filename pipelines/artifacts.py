"""Runner artifacts fetched once into a cache outside the repository, then used offline.

Three kinds, each from its own registry through its ordinary client: Maven jars (``mvn dependency:get``; Beam's
own downloader uses plain HTTP to a fixed host, which we cannot rely on), Go binaries (``go install`` of a
module version into the cache's ``bin/``) and PyPI wheels unpacked into a directory (``pip download``; never
installed beside Beam: ``apache-flink`` pins an old Beam), all in ``cache_dir()``. A fetch that fails raises
``ArtifactUnavailableError`` with one line naming what was asked for and the registry's own answer, so an
operator can see whether to retry or to bring the file.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from pipelines.broker.jars import cache_root

FETCH_TIMEOUT_S = 900  # a 300 MB wheel or a Go build on a slow machine


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
    """``group:artifact:version`` as a jar in the cache (fetched with ``mvn`` the first time)."""
    group, artifact, version = coordinates.split(":")
    target = cache_dir() / "maven" / f"{artifact}-{version}.jar"
    if target.is_file():
        return target
    if shutil.which("mvn") is None:
        raise ArtifactUnavailableError(f"{coordinates}: not in {target.parent} and no mvn on PATH to fetch it")
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
    """``go install package@version`` into the cache as ``bin/NAME-VERSION`` (built the first time)."""
    target = cache_dir() / "bin" / f"{name}-{version.lstrip('v')}"
    if target.is_file():
        return target
    if shutil.which("go") is None:
        raise ArtifactUnavailableError(f"{package}@{version}: not in {target.parent} and no go on PATH to build it")
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


def unpacked_wheel(requirement: str, directory: str) -> Path:
    """``pip download --no-deps REQUIREMENT`` unpacked under the cache as ``DIRECTORY`` (not installed)."""
    target = cache_dir() / directory
    if (target / ".complete").is_file():
        return target
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                           "-d", str(wheels), requirement], capture_output=True, text=True, timeout=FETCH_TIMEOUT_S)
    name, _, version = requirement.partition("==")
    found = sorted(wheels.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    if done.returncode != 0 or not found:
        raise ArtifactUnavailableError(f"pip download {requirement} failed: {_last_error(done.stderr + done.stdout)}")
    if target.exists():
        shutil.rmtree(target)  # an unpack cut short
    with zipfile.ZipFile(found[-1]) as wheel:
        wheel.extractall(target)
    (target / ".complete").write_text(requirement + "\n")
    return target
