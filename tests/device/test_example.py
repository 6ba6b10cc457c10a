"""The usage example of the package docstring (copied into the README) runs as written."""

from __future__ import annotations

import contextlib
import io
import os
import textwrap
from pathlib import Path

import transforms.device
from transforms.trust.keys import init_keys

ROOT = Path(__file__).resolve().parents[2]


def _example() -> str:
    doc = transforms.device.__doc__ or ""
    lines = []
    for line in doc.split("::\n\n", 1)[1].splitlines():
        if line and not line.startswith("    "):
            break
        lines.append(line)
    return textwrap.dedent("\n".join(lines)).strip() + "\n"


def test_docstring_example_runs(tmp_path, monkeypatch):
    code = _example()
    assert len([line for line in code.splitlines() if line]) <= 12 and "client.encode(" in code
    init_keys(tmp_path / "keys")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "transforms/device/__init__.py", "exec"), {})
    printed = out.getvalue()
    assert printed.startswith("enrol: ") and "spent 2 of 8" in printed
    assert os.stat(tmp_path / "device-state" / "device.key").st_mode & 0o077 == 0
