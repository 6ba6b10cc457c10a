"""A spec as JSON for device SDKs in other languages (``esa spec-json``): what a device needs, resolved.

Why resolved: an SDK must draw against the very doubles the Python client draws against (a keep
probability ``p`` that differs in its last bit between two ``exp`` implementations would make the two
clients disagree on one coin in 2^53) and must write the very payload bytes the analyzer decodes. So the
export carries the randomizer's probabilities as Python computes them (JSON floats round-trip exactly),
the wire facts (Avro union branch, padded plaintext length, the MessageSet single-object header) and the
budget rule, and an SDK recomputes none of them. Mechanisms an SDK does not implement are refused here
with a clear error rather than exported half-described.
"""

from __future__ import annotations

import math
from typing import Any

from schemas import SCHEMA_VERSION, load_schema
from transforms.device.accounting import report_cost
from transforms.device.backstop import backstop_identity, is_memoizing
from transforms.mechanisms.base import is_single_message
from transforms.spec import MAX_CROWD_ID_LENGTH, AnalysisSpec
from transforms.wire.avro_payload import payload_pad_length
from transforms.wire.rows import PAYLOAD_RECORDS, bit_length

__all__ = ["SPEC_JSON_FORMAT", "WEB_MECHANISMS", "spec_json"]

SPEC_JSON_FORMAT = 1
#: Mechanisms whose randomizer the web SDK implements (``clients/web/src/mechanisms``).
WEB_MECHANISMS = ("grr", "oue", "olh", "dyadic_range", "rappor_fragments")


def _union_index(kind: str) -> int:
    """The branch of a payload record in Report.avsc's payload union (what the Avro datum starts with)."""
    name = PAYLOAD_RECORDS[kind]
    for field in load_schema("Report").parsed["fields"]:
        if field["name"] == "payload":
            return [branch["name"] for branch in field["type"]].index(name)
    raise KeyError("no payload field in schemas/Report.avsc")


def _oracle(mech: Any) -> dict[str, Any]:
    """A single-message frequency oracle's parameters and exact probabilities."""
    if mech.name == "grr":
        return {"name": "grr", "d": mech.d, "epsilon": mech.epsilon, "p": mech.p, "q": mech.q}
    if mech.name == "oue":
        return {"name": "oue", "d": mech.d, "epsilon": mech.epsilon, "p": mech.p, "q": mech.q}
    if mech.name == "olh":
        return {"name": "olh", "d": mech.d, "epsilon": mech.epsilon, "g": mech.buckets,
                "seed_family": mech.seed_family, "p": mech.p}
    if mech.name == "llh":
        return {"name": "llh", "d": mech.d, "epsilon": mech.epsilon, "g": mech.buckets, "p": mech.p}
    raise ValueError(f"no web randomizer for oracle {mech.name!r}")


def _mechanism(mech: Any) -> dict[str, Any]:
    if mech.name in ("grr", "oue", "olh"):
        return _oracle(mech)
    if mech.name == "dyadic_range":
        oracles = mech.oracles
        return {"name": "dyadic_range", "bits": mech.bits, "epsilon": mech.epsilon, "levels": mech.levels,
                "oracle": oracles.oracle, "prefix_lengths": list(mech.prefix_lengths),
                "channels": mech.channels, "seed_family": oracles.seed_family,
                "oue_width": 1 << max(oracles.channel_bits),
                "level_oracles": [_oracle(m) for m in oracles.mechanisms]}
    if mech.name == "rappor_fragments":  # the permanent backstop, memoized on the device (transforms/device/memo.py)
        return {"name": "rappor_fragments", "d": mech.d, "epsilon_backstop": mech.epsilon_backstop,
                "epsilon_fragment": mech.eps_f, "fragments": mech.fragments, "channels": mech.channels,
                "q_backstop": mech.q_backstop, "p_backstop": 1.0 - mech.q_backstop,
                "q_fragment": mech.q_fragment, "keep_boost": mech.keep_boost,
                "backstop_cap": mech.backstop_cap, "fragment_cap": mech.fragment_cap,
                "log1p_neg_q_backstop": math.log1p(-mech.q_backstop),
                "log1p_neg_q_fragment": math.log1p(-mech.q_fragment)}
    raise ValueError(f"mechanism {mech.name!r} has no web randomizer (supported: {', '.join(WEB_MECHANISMS)})")


def _domain(spec: AnalysisSpec) -> dict[str, Any]:
    if spec.kind == "histogram":
        return {"categories": list(spec.categories)}
    if spec.kind in ("range", "quantiles"):
        value_range = spec.domain.get("value_range")
        return {"bits": int(spec.domain["bits"]),
                "value_range": None if value_range is None else [float(v) for v in value_range]}
    raise ValueError(f"analysis kind {spec.kind!r} has no web encoding (histogram, range, quantiles)")


def spec_json(spec: AnalysisSpec) -> dict[str, Any]:
    """The JSON-ready export of ``spec`` for a device SDK; ValueError if no SDK can randomize it."""
    mech = spec.randomizer
    described = _mechanism(mech)
    memoizing = is_memoizing(mech)
    cost = report_cost(mech, spec.spec_id, "0" if memoizing else None, 0)
    return {
        "format": SPEC_JSON_FORMAT,
        "spec_id": spec.spec_id,
        "name": spec.name,
        "kind": spec.kind,
        "metric": spec.metric,
        "window_seconds": spec.window_seconds,
        "crowd_partition": spec.crowd.partition,
        "max_crowd_id_length": MAX_CROWD_ID_LENGTH,
        "domain": _domain(spec),
        "mechanism": described,
        "wire": {
            "schema_version": SCHEMA_VERSION,
            "payload_kind": mech.payload_kind,
            "union_index": _union_index(mech.payload_kind),
            "mark_union_index": _union_index("mark"),
            "pad_length": payload_pad_length(mech),
            "bit_length": bit_length(mech) if mech.payload_kind == "bits" else None,
            "single_message": is_single_message(mech),
            "message_set_header": load_schema("MessageSet").header.hex(),
        },
        # memoizing: the k-th report of a value in an epoch costs 2 (eps(k tau) - eps((k - 1) tau))
        # (transforms/device/accounting.py); the SDK computes it, "epsilon_per_report" is the first report's
        "budget": {"memoizing": memoizing, "epsilon_per_report": cost.epsilon, "rule": cost.rule,
                   "identity": backstop_identity(spec.metric, mech) if memoizing else None},
    }
