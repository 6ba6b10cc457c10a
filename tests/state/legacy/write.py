"""Writes the legacy fixture with the esa on PYTHONPATH (run once, with the esa before typed events):

    PYTHONPATH=<checkout of 3ec1088> python tests/state/legacy/write.py tests/state/legacy
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parent))
import scenario

target = Path(sys.argv[1])
with tempfile.TemporaryDirectory() as tmp:
    first = scenario.run(Path(tmp), scenario.releases()[:scenario.SPLIT])
    shutil.rmtree(target / "ledger", ignore_errors=True)
    shutil.copytree(Path(tmp) / "ledger", target / "ledger")
    rest = scenario.run(Path(tmp), scenario.releases()[scenario.SPLIT:])
(target / "rows.json").write_text(json.dumps(first + rest, indent=1, sort_keys=True, default=str) + "\n")
