"""Every bash command of docs/querying.md, run as written from a checkout-like directory, in the order the
page gives them, at a smaller ``--clients``: the heavy-hitters demo, the query labelled with the shipped
``examples/urls.txt``, the ``--sum`` over app languages against the Quick start's ``out/demo``, ``esa report``
and ``esa plan``. A usage synopsis is fenced as ``text``, not ``bash``: nothing a reader would paste.

Before, the page's examples failed on the output they named: ``urls.txt`` was not shipped and ``en-US`` is
not an item of ``out/demo`` (whose items are language codes)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.readme_commands import QUICK_START_CLIENTS, REPO, QuickStart, blocks, commands, replace_option

pytestmark = pytest.mark.slow
DOC = REPO / "docs" / "querying.md"
# enough for the top URLs to stand out of the noise
CLIENTS = {"heavy_hitters": "10000", "histogram": QUICK_START_CLIENTS}
TIMEOUT_S = 900


def _bash_commands() -> list[tuple[str, ...]]:
    found = [c.argv for b in blocks(DOC.read_text(encoding="utf-8")) if b.lang == "bash" for c in commands(b)]
    assert found and all(argv[0] == "esa" for argv in found), found
    return found


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=TIMEOUT_S, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, f"esa {' '.join(argv)} exited {done.returncode}\n{done.stderr[-3000:]}"
    return done


def test_querying_doc_commands_run_as_written(tmp_path: Path, quick_start: QuickStart) -> None:
    (tmp_path / "examples").symlink_to(REPO / "examples", target_is_directory=True)
    # out/demo (and its .state and .keys), as the page assumes the Quick start left it: a copy of the session's
    # run (tests/docs/conftest.py), as `esa report` writes into it
    shutil.copytree(quick_start.out.parent, tmp_path / quick_start.out.parent.relative_to(quick_start.cwd),
                    symlinks=True)
    outputs = {}
    for argv in _bash_commands():
        args = list(argv[1:])
        if args[0] == "demo":
            kind = args[args.index("--kind") + 1] if "--kind" in args else "histogram"
            args = replace_option(args, "--clients", CLIENTS[kind])
        outputs[" ".join(argv)] = _run(args, tmp_path).stdout
    labelled = next(out for cmd, out in outputs.items() if "--candidates" in cmd)
    assert "(https://" in labelled, labelled  # at least one stored hash is labelled with a shipped URL
    summed = json.loads(next(out for cmd, out in outputs.items() if "--sum" in cmd))
    assert summed and all(s["items"] == ["en", "es", "pt"] for r in summed for s in r["sums"]), summed
    assert summed[0]["sums"], summed
    assert (tmp_path / "out" / "demo" / "report" / "app_language.html").exists()
