"""The README's test command splits the suite over pytest-xdist workers as tests/conftest.py says: the Flink
folder on one worker (one cluster per session), every other file whole on one worker (module fixtures once).

Run on a small tree of stand-in tests through the repository's own scheduler hook, so that a pytest or
pytest-xdist upgrade that silently stops it (as pytest 9.2 did to ``--dist loadgroup``) fails here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from tests.docs.readme_commands import REPO

RECORD = """
import json, os
from pathlib import Path

def record(request):
    with open(os.environ["CI_WORKERS_LOG"], "a") as log:
        log.write(json.dumps([request.node.nodeid, os.environ["PYTEST_XDIST_WORKER"]]) + "\\n")
"""
CONFTEST = """
import importlib.util

_spec = importlib.util.spec_from_file_location("repo_tests_conftest", {conftest!r})
_repo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_repo)
pytest_xdist_make_scheduler = _repo.pytest_xdist_make_scheduler
"""


def _stand_in(path: Path, tests: int) -> None:
    body = "\n".join(f"def test_{i}(request):\n    record(request)\n" for i in range(tests))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"from recorder import record\n\n\n{body}")


def test_flink_runs_on_one_worker_and_files_stay_whole(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    (root / "tests").mkdir(parents=True)
    (root / "recorder.py").write_text(RECORD)
    (root / "conftest.py").write_text(CONFTEST.format(conftest=str(REPO / "tests" / "conftest.py")))
    for name in ("test_cluster", "test_jobs", "test_savepoint"):
        _stand_in(root / "tests" / "flink" / f"{name}.py", 4)
    for i in range(6):
        _stand_in(root / "tests" / f"part{i}" / f"test_file{i}.py", 5)
    log = tmp_path / "workers.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))}
    env.update(CI_WORKERS_LOG=str(log), PYTHONPATH=os.pathsep.join([str(root), str(REPO)]))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile", "-p",
                           "no:cacheprovider", "--rootdir", str(root), "tests"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(runs) == 3 * 4 + 6 * 5
    workers_of: dict[str, set[str]] = defaultdict(set)
    for nodeid, worker in runs:
        unit = "tests/flink" if nodeid.startswith("tests/flink/") else nodeid.split("::")[0]
        workers_of[unit].add(worker)
    assert len(workers_of["tests/flink"]) == 1, workers_of  # the three Flink files share one worker
    assert all(len(w) == 1 for w in workers_of.values()), workers_of  # no file split
    assert len(set().union(*workers_of.values())) == 2  # and both workers had work
