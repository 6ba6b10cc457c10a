"""Every ```bash block of README.md and docs/*.md is run by a docs test, or says why it cannot be here.

Run: README.md and docs/guide.md (``test_readme_commands``, which classifies each command), docs/querying.md
(``test_querying_commands``). Any other block must be preceded by ``<!-- needs a cluster: REASON -->``
(Docker, Flink, Dataflow): a new command in the docs is either tested or marked, never silently stale."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.readme_commands import GUIDE, README, REPO

RUN_BY_TESTS = {README: "test_readme_commands.py", GUIDE: "test_readme_commands.py",
                REPO / "docs" / "querying.md": "test_querying_commands.py"}
MARK = re.compile(r"<!-- needs a cluster: ([^>]+?) -->\n```bash\n")
FENCE = re.compile(r"^```bash[ \t]*$", re.MULTILINE)
DOCS = [README, *sorted((REPO / "docs").glob("*.md"))]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_bash_block_is_run_or_marked(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    blocks, marked = len(FENCE.findall(text)), len(MARK.findall(text))
    if doc in RUN_BY_TESTS:
        assert (Path(__file__).parent / RUN_BY_TESTS[doc]).is_file()
        assert marked == 0, f"{doc.name} is run by {RUN_BY_TESTS[doc]}: nothing there needs a marker"
        return
    assert blocks == marked, (f"{doc.name}: {blocks - marked} bash block(s) neither run by a docs test nor marked "
                              "<!-- needs a cluster: REASON -->")


def test_the_marker_is_recognised() -> None:
    """The check can fail: an unmarked block is counted, a marked one is not."""
    assert len(MARK.findall("x\n<!-- needs a cluster: Flink -->\n```bash\nesa run\n```\n")) == 1
    assert len(MARK.findall("x\n\n```bash\nesa run\n```\n")) == 0
    assert len(FENCE.findall("```bash\nesa run\n```\n")) == 1
