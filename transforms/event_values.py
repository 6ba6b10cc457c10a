"""From a TelemetryEvent's value to what a mechanism encodes, per analysis kind (the client's side).

Two steps, because they fail differently. ``event_value`` checks one decoded value against the spec's
domain and says why it does not fit (the reason becomes the dead letter); it runs per event, where the
Avro decoding already is. ``client_inputs`` stacks a batch of checked values into the numpy input of the
mechanism's ``encode``; it may draw randomness (kv discretisation), always through the per-event keyed
``Randomness`` the encoder hands it, so a retried bundle reproduces it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from transforms.mechanisms.base import Randomness
from transforms.spec import AnalysisSpec


def _kind_name(value: Any) -> str:
    """'string', 'long', 'map', 'DenseVector', ... for error messages."""
    if isinstance(value, tuple):
        return value[0].rsplit(".", 1)[-1]
    return {str: "string", int: "long", float: "double", dict: "map"}.get(type(value), type(value).__name__)


def category_of(spec: AnalysisSpec, value: Any) -> int:
    """The category index of an event value, or ``ValueError`` saying why it is not in the domain."""
    if isinstance(value, str):
        index = spec.category_index.get(value)
        if index is None:
            raise ValueError(f"category {value!r} is not in the domain of {spec.name}")
        return index
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < spec.d:
            raise ValueError(f"category index {value} outside [0, {spec.d}) of {spec.name}")
        return value
    raise ValueError(f"a {_kind_name(value)} value cannot feed histogram {spec.name}")


def ordered_value(spec: AnalysisSpec, value: Any) -> int:
    """A number on the range/quantile domain as its bucket in [0, 2^bits)."""
    bits = spec.domain["bits"]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"a {_kind_name(value)} value cannot feed {spec.kind} analysis {spec.name}")
    if not math.isfinite(value):
        raise ValueError(f"value {value!r} is not finite")
    value_range = spec.domain.get("value_range")
    if value_range is None:
        if value != int(value) or not 0 <= value < 2**bits:
            raise ValueError(f"value {value!r} is not an integer in [0, 2^{bits}) of {spec.name}")
        return int(value)
    lo, hi = value_range
    if not lo <= value <= hi:
        raise ValueError(f"value {value!r} outside the value_range [{lo:g}, {hi:g}] of {spec.name}")
    return min(int((value - lo) / (hi - lo) * 2**bits), 2**bits - 1)


def event_value(spec: AnalysisSpec, value: Any) -> Any:
    """Check one decoded event value against the spec (``ValueError`` with the reason if it does not fit)."""
    if spec.kind == "histogram":
        return category_of(spec, value)
    if spec.kind in ("range", "quantile"):
        return ordered_value(spec, value)
    raise ValueError(f"analysis kind {spec.kind} has no event adapter")


def client_inputs(spec: AnalysisSpec, values: list[Any], rng: Randomness) -> Any:
    """Stack checked values into the mechanism's ``encode`` input."""
    if spec.kind in ("histogram", "range", "quantile"):
        return np.fromiter(values, dtype=np.int64, count=len(values))
    raise ValueError(f"analysis kind {spec.kind} has no event adapter")
