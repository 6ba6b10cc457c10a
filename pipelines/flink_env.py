"""``deploy/flink/env``: a Python environment with apache-beam 2.62.0 and this checkout, created once.

Why a second environment: the project supports a Beam range (``apache-beam>=2.62``). The main environment
keeps the newest Beam pip resolves; a job submitted to Flink must use the Beam of the job server it talks to,
and 2.62.0 is the newest Beam whose Flink runner and Java job service Maven Central serves (Flink 1.19,
``pipelines.flink_job_server``). The same environment is the SDK harness on the TaskManagers
(``<env>/bin/esa-sdk-harness``, Beam's PROCESS environment), so the driver and the workers run the same code.

The environment lives in the cache (``$ESA_CACHE_DIR``, else ``~/.cache/esa-telemetry``) under
``flink-env/beam-2.62.0-py<X.Y>-<key>``, the key a digest of this checkout's path and ``pyproject.toml``: the
project is installed editable, so the environment runs the code of the checkout it was made from, and a
changed dependency list makes a new one. Creation holds a lock (concurrent callers wait, then reuse it) and
writes ``.complete`` last: a half-made environment is never used, and is made again. Standard library only, so
that any ``python3`` can run it before anything is installed. The last line of stdout is the directory.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

BEAM_VERSION = "2.62.0"
ROOT = Path(__file__).resolve().parents[1]
COMPLETE = ".complete"
INSTALL_TIMEOUT_S = 1800  # pip on a loaded 2-core machine, cold cache


def cache_root() -> Path:
    """The project's cache (``pipelines.broker.jars.cache_root``, repeated: this module imports nothing)."""
    if os.environ.get("ESA_CACHE_DIR"):
        return Path(os.environ["ESA_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "esa-telemetry"


def env_dir(root: Path = ROOT) -> Path:
    digest = hashlib.sha256()
    for part in (str(root.resolve()).encode(), (root / "pyproject.toml").read_bytes(), BEAM_VERSION.encode(),
                 sys.version.split()[0].encode()):
        digest.update(part + b"\0")
    python = f"py{sys.version_info.major}.{sys.version_info.minor}"
    return cache_root() / "flink-env" / f"beam-{BEAM_VERSION}-{python}-{digest.hexdigest()[:12]}"


def ensure_env(root: Path = ROOT) -> Path:
    """The environment's directory, created on the first call (see the module's docstring)."""
    target = env_dir(root)
    if (target / COMPLETE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(target.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / COMPLETE).is_file():
            return target
        shutil.rmtree(target, ignore_errors=True)  # a creation cut short
        started = time.monotonic()
        print(f"creating {target} (apache-beam=={BEAM_VERSION} and {root}; once)", file=sys.stderr, flush=True)
        _run([sys.executable, "-m", "venv", str(target)])
        pip = [str(target / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        _run([*pip, f"apache-beam=={BEAM_VERSION}", "-e", str(root)])
        _run([str(target / "bin" / "python"), "-c", "import apache_beam, pipelines.cli, pipelines.harness_boot; "
              f"assert apache_beam.__version__ == {BEAM_VERSION!r}, apache_beam.__version__"])
        freeze = subprocess.run([str(target / "bin" / "python"), "-m", "pip", "freeze", "--exclude-editable"],
                                capture_output=True, text=True, check=True, timeout=300)
        (target / "requirements.lock").write_text(freeze.stdout)  # what was resolved, for the record
        (target / COMPLETE).write_text(f"created in {time.monotonic() - started:.0f} s\n")
    return target


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    if done.returncode != 0:
        lines = [ln for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
        raise SystemExit(f"flink env: {' '.join(cmd[:4])} ... failed: {lines[-1] if lines else done.returncode}")


def main() -> int:
    print(ensure_env(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
