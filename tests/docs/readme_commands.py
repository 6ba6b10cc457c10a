"""Extract the commands of README.md and of docs/guide.md, the guide it sends newcomers to (fenced ```bash
blocks and the ```python block) for the docs tests.

Nothing is hard-coded here: the tests read the README as users do, so a changed command is a tested
command. Every bash command is *classified*; a command of no known class is an error naming it, so a new
README command cannot go untested.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
QUICK_START_CLIENTS = "2000"  # the Quick start's --clients in the tests
GUIDE = REPO / "docs" / "guide.md"

_FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_HEADING = re.compile(r"^## (.+)$", re.MULTILINE)


@dataclass(frozen=True)
class Block:
    """One fenced block: its language, the ``##`` section it sits in, its text."""

    lang: str
    section: str
    text: str


@dataclass(frozen=True)
class Command:
    """One shell command: its text (continuations joined, comment kept out) and its ``&&``-separated argvs."""

    section: str
    line: str
    segments: tuple[tuple[str, ...], ...]

    @property
    def argv(self) -> tuple[str, ...]:
        """The last segment of a chain: what the command is for (the others install)."""
        return self.segments[-1]


def blocks(text: str | None = None) -> list[Block]:
    """Every fenced block of the README and the guide (or of ``text``) with the section it belongs to."""
    if text is None:
        return [b for path in (README, GUIDE) for b in blocks(path.read_text(encoding="utf-8"))]
    headings = [(m.start(), m.group(1).strip()) for m in _HEADING.finditer(text)]
    found = []
    for match in _FENCE.finditer(text):
        section = next((name for start, name in reversed(headings) if start < match.start()), "")
        found.append(Block(match.group(1), section, match.group(2)))
    return found


def _strip_comment(line: str) -> str:
    """The line without a trailing ``# comment`` (a ``#`` inside quotes is kept)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def commands(block: Block) -> list[Command]:
    """The commands of a bash block: backslash continuations joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", block.text)
    out = []
    for raw in joined.splitlines():
        line = _strip_comment(raw).strip()
        if not line:
            continue
        line = re.sub(r"\s+", " ", line)
        tokens = shlex.split(line)
        segments, current = [], []
        for token in tokens:
            if token == "&&":
                segments.append(tuple(current))
                current = []
            else:
                current.append(token)
        segments.append(tuple(current))
        if any(not s for s in segments):
            raise ValueError(f"README command with an empty part: {line!r}")
        out.append(Command(block.section, line, tuple(segments)))
    return out


def bash_commands() -> list[Command]:
    return [c for b in blocks() if b.lang == "bash" for c in commands(b)]


def python_blocks() -> list[Block]:
    return [b for b in blocks() if b.lang == "python"]


_INSTALL = (("python3", "-m", "venv", ".venv"),)


def _is_install(segment: tuple[str, ...]) -> bool:
    return segment in _INSTALL or segment[:2] == (".venv/bin/pip", "install")


def classify(command: Command) -> str:
    """The class of a README command (which test runs it); ValueError names a command no test knows."""
    *prefix, argv = command.segments
    if prefix and not all(_is_install(s) for s in prefix[:2]):
        raise ValueError(f"README command with an unknown prefix: {command.line!r}")
    if prefix and any(s[-2:] == ("-m", "pytest") or "pytest" in s for s in command.segments):
        return "ci"
    if prefix and argv[:2] == (".venv/bin/esa", "demo") and len(prefix) == 2:
        return "quickstart-demo"
    if prefix:
        raise ValueError(f"README command not run by any test: {command.line!r}")
    if argv[0] in ("python", ".venv/bin/python") and argv[1:4] == ("-m", "transforms.trust", "init") and len(argv) == 5:
        return "trust-init"
    if argv[0] in ("esa", ".venv/bin/esa") and len(argv) > 1:
        sub = argv[1]
        if sub in ("encode", "shuffle", "analyze") and "--follow" in argv:
            return "service"
        if sub == "simulate":
            return "service-simulate"
        if sub == "edge":
            return "service-edge"
        if sub == "privacy":
            return "privacy-horse" if option(argv, "--mechanism") == "rappor" else "privacy"
        if sub == "plan":
            return "plan"
        if sub == "demo" and option(argv, "--kind") == "range":
            return "range-demo"
        if sub == "query":
            return "query"
    raise ValueError(f"README command not run by any test: {command.line!r}")


def option(argv: tuple[str, ...] | list[str], flag: str) -> str | None:
    """The value after ``flag`` in ``argv`` (None when absent)."""
    return argv[argv.index(flag) + 1] if flag in argv and argv.index(flag) + 1 < len(argv) else None


def replace_option(argv: list[str], flag: str, value: str) -> list[str]:
    """``argv`` with ``flag``'s value replaced (the flag must be there: the README command is what we test)."""
    if flag not in argv:
        raise ValueError(f"{flag} is not in {argv}")
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


def by_class(kind: str) -> list[Command]:
    return [c for c in bash_commands() if classify(c) == kind]


@dataclass(frozen=True)
class QuickStart:
    """Where the Quick start's demo ran (its ``--out`` is relative to ``cwd``, as in the README) and its output."""

    cwd: Path
    done: subprocess.CompletedProcess[str]

    @property
    def out(self) -> Path:
        (command,) = by_class("quickstart-demo")
        return self.cwd / str(option(command.argv, "--out"))


def run_quick_start(cwd: Path) -> QuickStart:
    """The README's Quick start demo as written but for ``--clients``, run by this interpreter in ``cwd``."""
    (command,) = by_class("quickstart-demo")
    head, *args = replace_option(list(command.argv), "--clients", QUICK_START_CLIENTS)
    assert head in ("esa", ".venv/bin/esa"), command.argv
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, f"{command.line}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return QuickStart(cwd, done)
