"""Staging: what a pipeline run hands to its driver, written atomically into the run's staging directory.

The driver acts on staged results only after the whole pipeline succeeded (seal, publish, commit), so a
run that dies leaves nothing visible outside its staging directory. Names are derived from the element
(not from the bundle), so a retried bundle overwrites its own files instead of adding copies.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import apache_beam as beam

from transforms.state.files import atomic_write_bytes


def stable_name(*parts: Any) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:24]


class StageFn(beam.DoFn):
    """Write each element to ``directory/<prefix>-<name>.pkl`` (atomic; same element -> same file)."""

    def __init__(self, directory: str, prefix: str, name_of: Callable[[Any], str]):
        self._directory, self._prefix, self._name_of = directory, prefix, name_of

    def process(self, element: Any) -> Iterator[None]:
        path = Path(self._directory) / f"{self._prefix}-{self._name_of(element)}.pkl"
        atomic_write_bytes(path, pickle.dumps(element, protocol=pickle.HIGHEST_PROTOCOL))
        return iter(())


def load_staged(directory: Path, prefix: str) -> list[Any]:
    """Every element staged under ``prefix``, in file-name order (deterministic)."""
    return [pickle.loads(p.read_bytes()) for p in sorted(directory.glob(f"{prefix}-*.pkl"))]
