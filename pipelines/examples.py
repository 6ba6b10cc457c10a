"""The example analysis specs, found the same way in a source checkout and in an installed wheel.

The one copy lives in the repository's top-level ``examples/``; ``pipelines/example_specs`` is a symbolic
link to it, through which the wheel ships the files as package data of ``pipelines``.
"""

from __future__ import annotations

from pathlib import Path

EXAMPLES_DIR = Path(__file__).resolve().parent / "example_specs"
DEFAULT_EXAMPLE = "app_language.toml"


def example_names() -> list[str]:
    """File names of the shipped example specs."""
    return sorted(p.name for p in EXAMPLES_DIR.glob("*.toml"))


def example_path(name: str = DEFAULT_EXAMPLE) -> Path:
    """Path of an example spec by file name (``"grid.toml"`` or ``"grid"``); ValueError naming the known
    examples if there is no such file."""
    file = name if name.endswith(".toml") else f"{name}.toml"
    path = EXAMPLES_DIR / file
    if not path.is_file():
        known = ", ".join(example_names()) or f"none: {EXAMPLES_DIR} is missing (a broken installation)"
        raise ValueError(f"no example spec {name!r}; the examples are: {known}")
    return path
