"""A same-named PyPI project beside ours: ``transforms`` and ``schemas`` are names of unrelated PyPI projects.
Found after ours on the path, it is harmless; found first, ``esa`` refuses in one line naming it instead of
failing somewhere inside with an ImportError."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRIVACY = ["privacy", "--mechanism", "grr", "--domain", "4", "--epsilon", "1", "--n", "1000", "--delta", "1e-6"]


def _esa(pythonpath: list[Path], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, pythonpath))}
    code = f"import sys; from pipelines.cli import main; sys.exit(main({PRIVACY!r}))"
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def impostor(tmp_path: Path) -> Path:
    """A site directory holding a ``transforms`` package as a PyPI project of that name would install it."""
    site = tmp_path / "site"
    (site / "transforms").mkdir(parents=True)
    (site / "transforms" / "__init__.py").write_text("NAME = 'someone else'\n")
    return site


def test_a_same_named_package_after_ours_is_harmless(impostor: Path, tmp_path: Path) -> None:
    done = _esa([REPO, impostor], tmp_path)
    assert done.returncode == 0 and "grr" in done.stdout, done.stderr


def test_a_same_named_package_before_ours_is_refused_in_one_line(impostor: Path, tmp_path: Path) -> None:
    done = _esa([impostor, REPO], tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 3 and len(lines) == 1, done.stderr
    assert f"transforms from {impostor / 'transforms' / '__init__.py'}" in lines[0] and "pip uninstall" in lines[0]
