"""From a TelemetryEvent's value to what a mechanism encodes, per analysis kind (the client's side).

Two steps, because they fail differently. ``event_value`` checks one decoded value against the spec's
domain and says why it does not fit (the reason becomes the dead letter); it runs per event, where the
Avro decoding already is. ``client_inputs`` stacks a batch of checked values into the numpy input of the
mechanism's ``encode``; it may draw randomness (kv discretisation), always through the per-event keyed
``Randomness`` the encoder hands it, so a retried bundle reproduces it.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import numpy as np

from transforms.mechanisms.base import Randomness
from transforms.mechanisms.heavy_hitters.prefix_tree import item_hash
from transforms.mechanisms.keyvalue.kv_encoding import KeyValueEncoder
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


def kv_encoder(spec: AnalysisSpec) -> KeyValueEncoder:
    """The spec's real-valued key-value encoder (keys, s and value range shared with the mechanism)."""
    return _kv_encoder(spec)


@cache
def _kv_encoder(spec: AnalysisSpec) -> KeyValueEncoder:
    return KeyValueEncoder.for_mechanism(spec.randomizer, spec.categories, spec.domain["value_range"])


def kv_value(spec: AnalysisSpec, value: Any) -> dict[str, float]:
    """A map<string, double> event over the spec's keys (unknown keys, NaN/inf, out-of-range are refused)."""
    if not isinstance(value, dict):
        raise ValueError(f"a {_kind_name(value)} value cannot feed kv_mean analysis {spec.name} (needs a map)")
    reason = kv_encoder(spec).event_error(value)
    if reason is not None:
        raise ValueError(reason)
    return value


def vector_value(spec: AnalysisSpec, value: Any) -> np.ndarray:
    """A DenseVector event of the spec's dimension with finite entries in its value range."""
    if not (isinstance(value, tuple) and value[0].endswith("DenseVector")):
        raise ValueError(f"a {_kind_name(value)} value cannot feed vector_mean analysis {spec.name} "
                         "(needs a DenseVector)")
    x = np.asarray(value[1]["values"], dtype=np.float64)
    if x.shape != (spec.d,):
        raise ValueError(f"vector of length {x.size}, expected {spec.d}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"vector entry {int(np.argmin(np.isfinite(x)))} is not finite")
    lo, hi = spec.domain["value_range"]
    outside = (x < lo) | (x > hi)
    if outside.any():
        i = int(np.argmax(outside))
        raise ValueError(f"vector entry {i} = {float(x[i])!r} outside the value_range [{lo:g}, {hi:g}]")
    return x


def to_input_range(spec: AnalysisSpec, x: np.ndarray) -> np.ndarray:
    """Map values from the spec's value range onto the mechanism's ``input_range``, if it declares one."""
    target = spec.randomizer.input_range
    if target is None:
        return x
    (lo, hi), (a, b) = spec.domain["value_range"], target
    return a + (x - lo) * (b - a) / (hi - lo)


def from_input_range(spec: AnalysisSpec, mean: np.ndarray, stderr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of ``to_input_range`` for a mean and its standard error."""
    target = spec.randomizer.input_range
    if target is None:
        return mean, stderr
    (lo, hi), (a, b) = spec.domain["value_range"], target
    scale = (hi - lo) / (b - a)
    return lo + (mean - a) * scale, stderr * scale


def hashed_item(spec: AnalysisSpec, value: Any) -> int:
    """A heavy-hitter item (string or integer) as its ``bits``-bit hash."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(f"a {_kind_name(value)} value cannot feed heavy_hitters analysis {spec.name}")

    return int(item_hash([str(value)], spec.domain["bits"])[0])


_CHECKS = {"histogram": category_of, "range": ordered_value, "quantile": ordered_value, "kv_mean": kv_value,
           "vector_mean": vector_value, "heavy_hitters": hashed_item}


def event_value(spec: AnalysisSpec, value: Any) -> Any:
    """Check one decoded event value against the spec (``ValueError`` with the reason if it does not fit)."""
    return _CHECKS[spec.kind](spec, value)


def client_inputs(spec: AnalysisSpec, values: list[Any], rng: Randomness) -> Any:
    """Stack checked values into the mechanism's ``encode`` input."""
    if spec.kind == "kv_mean":
        return kv_encoder(spec).encode_events(values, rng)
    if spec.kind == "vector_mean":
        x = np.stack(values) if values else np.zeros((0, spec.d))
        return to_input_range(spec, x)
    return np.fromiter(values, dtype=np.uint64 if spec.kind == "heavy_hitters" else np.int64, count=len(values))
