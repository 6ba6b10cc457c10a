"""Typed privacy events: what one released window costs, and the one place its central epsilon is computed.

In the style of Google's dp_accounting (a ``NeighboringRelation`` enum, typed ``DpEvent`` values an accountant
consumes): a ``WindowEvent`` is one window of one population as the analyst's ledger stores it (frozen,
versioned, JSON round-trip exact), and ``central_epsilon(event)`` is the only function that turns an event into
the published per-window epsilon and the name of the bound that gave it. The analyzer's rows
(``transforms.analyzer.estimates``), ``esa privacy`` (``report``) and ``esa plan`` (``transforms.planning``)
all call it, so the three can never disagree; the odometer composes ``event.to_release()``.

``window_event`` builds an event from a mechanism (duck-typed: this package imports no mechanism). Ledgers
written before events stored a plain "accounting" dict: ``event_json.from_account`` reads those.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ._checks import check_delta, check_int
from .blanket_shuffle import BOUND_BLANKET, BOUND_GENERIC, BlanketDecomposition, best_epsilon

if TYPE_CHECKING:
    from .window_release import WindowRelease

__all__ = ["BOUND_LOCAL", "BOUND_OWN", "EVENT_VERSION", "CentralEpsilon", "NeighbouringRelation", "WindowEvent",
           "central_epsilon", "certified", "window_event"]

EVENT_VERSION = 1
BOUND_LOCAL = "local (no shuffling)"
BOUND_OWN = "mechanism's own accountant"


class NeighbouringRelation(enum.Enum):
    """Which datasets are neighbours (docs/mathematics.md §1.1); the value is the name every published epsilon
    carries (the rows' ``notion`` column). Every per-window ``eps_central`` is ``REPLACEMENT`` (one device's
    value replaced, n public); a spec's crowd claims widen the relation and make the crowd count cost
    (``count_charges``). ``REMOVAL`` is [ESA]'s removal notion against a reference law, in which the unary
    encodings' ``eps_local_removal`` / ``eps_central_removal`` parameters are stated (never a composed total)."""

    REPLACEMENT = "replacement"
    REPLACEMENT_ACROSS_PARTITIONS = "replacement across partitions"
    REPLACEMENT_MEMBERSHIP = "replacement + membership"
    REPLACEMENT_ACROSS_PARTITIONS_MEMBERSHIP = "replacement across partitions + membership"
    REMOVAL = "removal"

    @classmethod
    def of_claims(cls, partition: bool, membership: bool) -> NeighbouringRelation:
        """The relation of a spec's ``[crowd]`` claims (``crowd_count.neighbouring_notion``'s names)."""
        base = "replacement across partitions" if partition else "replacement"
        return cls(base + (" + membership" if membership else ""))

    @property
    def count_charges(self) -> int:
        """Counts that change by one between neighbours in a window (``crowd_count.count_charges``)."""
        if self is NeighbouringRelation.REMOVAL:
            raise ValueError("removal is a per-window parameter notion; no window count is composed in it")
        return 2 if "partitions" in self.value else (1 if "membership" in self.value else 0)


@dataclass(frozen=True)
class CentralEpsilon:
    """``central_epsilon``'s answer: the published epsilon, the bound that gave it, and every valid bound it
    was the smallest of (name -> epsilon; None where the bound does not apply)."""

    epsilon: float
    bound: str
    candidates: tuple[tuple[str, float | None], ...] = ()

    def candidate(self, name: str) -> float | None:
        return dict(self.candidates).get(name)


@dataclass(frozen=True)
class WindowEvent:
    """One released window of one population (version ``EVENT_VERSION``).

    Inputs: ``mechanism`` (its name), ``relation``, ``n_clients`` released, ``delta``, the shuffled report's
    ``eps_local`` (replacement, or the removal budget of a two-channel unary encoding), ``mixture_alpha`` and
    blanket decomposition (None: only the generic pair), ``channels`` one replacement changes (unary
    encodings: 2), ``reports_per_client``, and ``own_epsilon``: the mechanism's own accountant's value at
    ``delta`` where it has one (``own_accountant``). Outputs, filled by ``certified``: ``eps_central`` and
    ``bound``. The crowd count as charged: ``count_sigma``/``count_threshold``/``count_charges`` (the yearly
    design; ``count_charges`` None on an event read from a ledger written before it, which carries its
    per-window Laplace count as ``legacy_count`` (epsilon, delta), charged only under a claim)."""

    mechanism: str
    relation: NeighbouringRelation
    n_clients: int
    delta: float
    eps_local: float | None
    mixture_alpha: float | None = None
    blanket: BlanketDecomposition | None = None
    channels: int = 1
    reports_per_client: int = 1
    own_accountant: bool = False
    own_epsilon: float | None = None
    eps_central: float | None = None
    bound: str | None = None
    metric: str | None = None
    window_seconds: int | None = None
    count_sigma: float | None = None
    count_threshold: int | None = None
    count_charges: int | None = 0
    legacy_count: tuple[float, float] | None = None
    version: int = EVENT_VERSION

    def __post_init__(self) -> None:
        if not isinstance(self.relation, NeighbouringRelation):
            raise ValueError(f"relation must be a NeighbouringRelation, got {self.relation!r}")
        if self.version != EVENT_VERSION:
            raise ValueError(f"window event version {self.version!r}; this esa reads version {EVENT_VERSION}")
        check_int("n_clients", self.n_clients, 0)
        check_int("channels", self.channels, 1)
        check_int("reports_per_client", self.reports_per_client, 1)
        check_delta("delta", self.delta)
        if self.count_charges is not None:
            check_int("count_charges", self.count_charges, 0)
        if self.count_charges and (self.count_sigma is None or self.count_threshold is None):
            raise ValueError("a charged count needs count_sigma and count_threshold")
        if self.own_accountant and self.reports_per_client != 1:
            raise ValueError("a mechanism's own accountant covers one report per client")

    @property
    def composes_by_pld(self) -> bool:
        """True: the odometer composes the shuffled reports' exact loss distribution (single report, finite
        eps_local, the tight bound's parameters); False: the window's (eps_central, delta) guarantee."""
        return (self.reports_per_client == 1 and self.mixture_alpha is not None and self.eps_local is not None
                and math.isfinite(self.eps_local) and (not self.own_accountant or self.channels > 1))

    def to_release(self, charge_legacy_count: bool = False) -> WindowRelease:
        """The odometer's ``WindowRelease`` of this window: its reports' pair (or its (eps, delta)), its count."""
        from .window_release import WindowRelease  # dp_accounting (~0.8 s): only where windows are composed

        crowd: tuple[Any, Any] = (None, None)
        if self.count_charges is None and charge_legacy_count and self.legacy_count is not None:
            crowd = self.legacy_count
        count = {"count_sigma": self.count_sigma, "count_threshold": self.count_threshold,
                 "count_charges": int(self.count_charges or 0)}
        if not self.composes_by_pld:
            if self.eps_central is None:
                raise ValueError(f"a {self.mechanism} window composed by its (eps, delta) needs eps_central")
            return WindowRelease(None, None, self.n_clients, *crowd, float(self.eps_central), float(self.delta),
                                 **count)
        blanket = self.blanket.as_tuple() if self.blanket is not None and self.channels == 1 else None
        return WindowRelease(self.mixture_alpha, self.eps_local, self.n_clients, *crowd, **count,
                             channels=self.channels, blanket=blanket)

    @property
    def finite(self) -> bool:
        """False where the window has no finite guarantee (the composition is then unbounded too)."""
        return self.composes_by_pld or (self.eps_central is not None and math.isfinite(float(self.eps_central)))


def central_epsilon(event: WindowEvent) -> CentralEpsilon:
    """THE per-window central epsilon of ``event`` (replacement), with the bound that gave it
    (docs/mathematics.md §1.2): no amplification below 2 clients; the mechanism's own accountant where it has
    one; otherwise the smaller of the generic clone pair and, where the randomizer declares a decomposition,
    the blanket pair (``blanket_shuffle.best_epsilon``). With k reports per client a neighbouring dataset
    changes k reports: the single-report bound at delta' = delta / sum_{i<k} e^{i eps_local}, chained over k
    (§1.4; the total delta stays within ``delta`` because the per-report epsilon never exceeds eps_local)."""
    k = event.reports_per_client
    if event.n_clients < 2:
        if event.eps_local is None:
            raise ValueError("a window of fewer than 2 clients is charged its eps_local, which the event lacks")
        return CentralEpsilon(k * float(event.eps_local), BOUND_LOCAL)
    if event.own_accountant:
        if event.own_epsilon is None:
            raise ValueError(f"the {event.mechanism} event names its own accountant but carries no own_epsilon")
        return CentralEpsilon(float(event.own_epsilon), BOUND_OWN)
    if event.mixture_alpha is None or event.eps_local is None:
        raise ValueError(f"the {event.mechanism} event has neither the shuffle parameters nor an own accountant")
    eps_local = float(event.eps_local)
    if k == 1:
        return _shuffle(event.n_clients, event.mixture_alpha, eps_local, event.delta, event.blanket, "")
    spread = math.expm1(k * eps_local) / math.expm1(eps_local) if k * eps_local < 700 else math.inf
    delta_per_report = event.delta / spread  # sum_{i<k} e^{i eps_local} >= sum_{i<k} e^{i eps_c}
    if delta_per_report < 1e-300:
        return CentralEpsilon(k * eps_local, BOUND_LOCAL)  # nothing certifiable: the plain composition
    one = _shuffle(event.n_clients, event.mixture_alpha, eps_local, delta_per_report, event.blanket,
                   f", chained over {k} reports")
    return CentralEpsilon(k * one.epsilon, one.bound, tuple((name, None if v is None else k * v)
                                                             for name, v in one.candidates))


def _shuffle(n: int, alpha: float, eps_local: float, delta: float, dec: BlanketDecomposition | None,
             suffix: str) -> CentralEpsilon:
    bounds: dict[str, float] = {}
    eps, bound = best_epsilon(n, alpha, eps_local, delta, dec, bounds=bounds)
    return CentralEpsilon(eps, bound + suffix, ((BOUND_GENERIC, bounds[BOUND_GENERIC]),
                                                (BOUND_BLANKET, bounds.get(BOUND_BLANKET))))


def certified(event: WindowEvent) -> WindowEvent:
    """``event`` with its ``eps_central`` and ``bound`` filled by ``central_epsilon``."""
    result = central_epsilon(event)
    return replace(event, eps_central=result.epsilon, bound=result.bound)


def window_event(mechanism: Any, n: int, delta: float, reports_per_client: int = 1,
                 relation: NeighbouringRelation = NeighbouringRelation.REPLACEMENT, *,
                 own_epsilon: float | None = None, **context: Any) -> WindowEvent:
    """The (uncertified) event of n clients' shuffled reports of ``mechanism`` (a ``Randomizer``): what
    ``central_epsilon`` and the odometer need of it, read only where they use it. ``own_epsilon``: the
    mechanism's own accountant's value when the caller has it already (else asked of the mechanism).
    ``context``: ``metric``, ``window_seconds`` and the count fields, stored as given."""
    k = check_int("reports_per_client", reports_per_client, 1)
    n = check_int("n", n, 0)
    eps_local = float(mechanism.epsilon_local)
    own = bool(mechanism.accounts_central) and k == 1
    channels = 2 if mechanism.epsilon_replacement is not None else 1
    by_pld = k == 1 and math.isfinite(eps_local) and (not own or channels > 1)
    by_shuffle = n >= 2 and not own
    alpha = float(mechanism.mixture_alpha) if by_pld or by_shuffle else None
    dec = mechanism.blanket_decomposition() if by_shuffle or (by_pld and channels == 1) else None
    own_eps = None
    if own and n >= 2:
        own_eps = float(mechanism.epsilon_central(n, delta)) if own_epsilon is None else float(own_epsilon)
    return WindowEvent(mechanism=str(mechanism.name), relation=relation, n_clients=n, delta=float(delta),
                       eps_local=eps_local, mixture_alpha=alpha, blanket=dec, channels=channels,
                       reports_per_client=k, own_accountant=own, own_epsilon=own_eps, **context)
