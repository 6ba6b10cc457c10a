"""The analyst's odometer when a window has no finite guarantee: unbounded, not a failed release."""

from __future__ import annotations

import math

from transforms.privacy_ledger import cumulative_for_spec
from transforms.spec import spec_from_dict

SPEC = spec_from_dict({
    "analysis": {"name": "odo", "metric": "odo"}, "domain": {"size": 8},
    "mechanism": {"name": "grr", "epsilon": 2.0}, "window": {"size_seconds": 3600},
}, source="test")


def _own(eps_central: float | None) -> dict:
    return {"mechanism": "mm_hadamard", "own_accountant": True, "mixture_alpha": None, "eps_local": None,
            "n_clients": 4000, "eps_central": eps_central, "delta": 1e-6, "crowd_epsilon": 1.0,
            "crowd_delta": 1e-6}


def test_an_infinite_window_makes_the_total_infinite() -> None:
    assert cumulative_for_spec(SPEC, [_own(0.5), _own(math.inf)], 1e-5) == math.inf
    assert cumulative_for_spec(SPEC, [_own(None)], 1e-5) == math.inf

