"""The analyst's odometer when a window has no finite guarantee: unbounded, not a failed release."""

from __future__ import annotations

import math

from transforms.analyzer.ledger_rows import cumulative_for_spec
from transforms.privacy.event_json import from_account
from transforms.privacy.events import WindowEvent
from transforms.spec import spec_from_dict

SPEC = spec_from_dict({
    "analysis": {"name": "odo", "metric": "odo"}, "domain": {"size": 8},
    "mechanism": {"name": "grr", "epsilon": 2.0}, "window": {"size_seconds": 3600},
}, source="test")


def _own(eps_central: float | None, mechanism: str = "mm_hadamard") -> WindowEvent:
    """A window composed by its own (eps, delta), as a ledger written before typed events stored it."""
    return from_account({"mechanism": mechanism, "own_accountant": True, "mixture_alpha": None, "eps_local": None,
                         "n_clients": 4000, "eps_central": eps_central, "delta": 1e-6, "crowd_epsilon": 1.0,
                         "crowd_delta": 1e-6})


def test_an_infinite_window_makes_the_total_infinite() -> None:
    assert cumulative_for_spec(SPEC, [_own(0.5), _own(math.inf)], 1e-5) == math.inf
    assert cumulative_for_spec(SPEC, [_own(None)], 1e-5) == math.inf



def test_a_large_window_epsilon_composes_on_the_odometers_coarsest_grid() -> None:
    """A grid spec's window (eps_central 16: k-RAPPOR at removal 8) used to ask for a 0.016 grid, which the
    odometer refuses: every release of the population failed after it was sealed, jamming the analyzer. The
    grid is capped at 0.01; the total lies between the window's own epsilon and basic composition (16, plus
    the crowd count's 1 where it is charged), each bound loosened by one grid step per composed distribution."""
    from transforms.analyzer.ledger_rows import composition_interval
    from transforms.privacy.odometer import MAX_INTERVAL

    window = _own(16.0, "rappor")
    assert composition_interval([window]) == MAX_INTERVAL == 0.01
    one = cumulative_for_spec(SPEC, [window], 1e-5)
    # Read at delta 1e-5 > the window's 1e-6, a (16, 1e-6) window's loss is 16 + ln(1 - 9e-6) ~ 16 - 9e-6.
    assert 16.0 - 1e-4 <= one <= 17.0 + 2 * MAX_INTERVAL
    two = cumulative_for_spec(SPEC, [window, window], 1e-5)
    assert one < two <= 2 * 17.0 + 4 * MAX_INTERVAL
