"""Which mechanisms serve which analysis kind, and how a spec's domain becomes constructor arguments.

The spec names a mechanism and its parameters; this table turns ``[domain]`` values (d, s, bits, ...) and
``[mechanism] epsilon`` into the mechanism's own constructor arguments, and lists the parameters a spec
may set (the dataclass fields that the domain does not fix), so a typo in ``[mechanism]`` is refused
instead of being ignored. Classes are imported on first use: a client that only needs GRR does not pay
for the heavier modules.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DomainArgs = Callable[[dict[str, Any]], dict[str, Any]]


def _d(domain: dict[str, Any]) -> dict[str, Any]:
    return {"d": domain["d"]}


def _d_s(domain: dict[str, Any]) -> dict[str, Any]:
    return {"d": domain["d"], "s": domain["s"]}


def _bits(domain: dict[str, Any]) -> dict[str, Any]:
    return {"bits": domain["bits"]}


def _item_bits(domain: dict[str, Any]) -> dict[str, Any]:
    return {"item_bits": domain["bits"]}


@dataclass(frozen=True)
class Entry:
    """One registered mechanism: the analysis kinds it serves and how to build it from a spec."""

    kinds: tuple[str, ...]
    module: str
    cls: str
    domain_args: DomainArgs
    epsilon_arg: str = "epsilon"

    def load(self) -> type:
        return getattr(importlib.import_module(f"transforms.mechanisms.{self.module}"), self.cls)

    def parameters(self) -> set[str]:
        """Constructor fields a spec's ``[mechanism]`` table may set."""
        fixed = {"d", "s", "bits", "item_bits", self.epsilon_arg}
        return {f.name for f in dataclasses.fields(self.load()) if f.init and f.name not in fixed}


HISTOGRAM, KV_MEAN, VECTOR_MEAN = ("histogram",), ("kv_mean",), ("vector_mean",)
RANGES = ("range", "quantile")
MECHANISMS: dict[str, Entry] = {
    "grr": Entry(HISTOGRAM, "frequency.oracles", "GRR", _d),
    "oue": Entry(HISTOGRAM, "frequency.oracles", "OUE", _d),
    "olh": Entry(HISTOGRAM, "frequency.olh", "OLH", _d),
    "hadamard": Entry(HISTOGRAM, "frequency.hadamard", "HadamardResponse", _d),
    "cms": Entry(HISTOGRAM, "frequency.count_mean_sketch", "CountMeanSketch", _d),
    "rappor": Entry(HISTOGRAM, "frequency.unary", "AttributeFragmentedRappor", _d),
    "rappor_fragments": Entry(HISTOGRAM, "frequency.unary", "ReportFragmentedRappor", _d, "epsilon_backstop"),
    "mm_hadamard": Entry(HISTOGRAM, "multimessage.protocols", "MultiMessageHadamard", _d),
    "mm_countmin": Entry(HISTOGRAM, "multimessage.protocols", "CountMinMultiRR", _d),
    "collision": Entry(KV_MEAN, "keyvalue.collision", "Collision", _d_s),
    "coco": Entry(KV_MEAN, "keyvalue.collision", "CoCo", _d_s),
    "privkv": Entry(KV_MEAN, "keyvalue.kv_baselines", "PrivKV", _d_s),
    "pckv-ue": Entry(KV_MEAN, "keyvalue.kv_baselines", "PCKVUE", _d_s),
    "pckv-grr": Entry(KV_MEAN, "keyvalue.kv_baselines", "PCKVGRR", _d_s),
    "vector_sum": Entry(VECTOR_MEAN, "vector.summation", "VectorSummation", _d),
    "ldp_sgd": Entry(VECTOR_MEAN, "vector.summation", "LdpSgdRandomizer", _d),
    "dyadic_range": Entry(RANGES, "ranges.dyadic", "DyadicRange", _bits),
    "mm_range": Entry(RANGES, "multimessage.range", "MultiMessageRange", _bits),
    "prefix_heavy_hitters": Entry(("heavy_hitters",), "heavy_hitters.prefix_tree", "PrefixHeavyHitters", _item_bits),
}


def mechanisms_for(kind: str) -> list[str]:
    """Names of the mechanisms that can serve an analysis kind."""
    return [name for name, entry in MECHANISMS.items() if kind in entry.kinds]


def build_mechanism(name: str, kind: str, domain: dict[str, Any], epsilon: float, params: dict[str, Any]) -> Any:
    """Construct mechanism ``name`` for an analysis of ``kind``; ``ValueError`` says what is wrong."""
    entry = MECHANISMS.get(name)
    if entry is None or kind not in entry.kinds:
        raise ValueError(f"mechanism must be one of {', '.join(mechanisms_for(kind))} for a {kind} analysis "
                         f"(got {name!r})")
    unknown = set(params) - entry.parameters()
    if unknown:
        raise ValueError(f"{sorted(unknown)[0]} is not a parameter of {name} "
                         f"(parameters: {', '.join(sorted(entry.parameters())) or 'none'})")
    cls = entry.load()
    if "delta" in domain and "delta" in entry.parameters() and "delta" not in params:
        params = {**params, "delta": domain["delta"]}  # mechanisms calibrated to a delta default to the spec's
    try:
        return cls(**entry.domain_args(domain), **{entry.epsilon_arg: epsilon}, **params)
    except TypeError as err:
        raise ValueError(f"bad parameters for {name}: {err}") from None
