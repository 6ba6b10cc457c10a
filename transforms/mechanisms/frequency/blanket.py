"""The blanket role: randomizers whose output law has an input-independent component the shuffler can sample.

A randomizer R has a *blanket* of weight gamma and law B when R(x) = (1 - gamma) R'(x) + gamma B for every
input x, with B the same for all x. The shuffler can then add m dummy reports drawn from B to a release: they
look exactly like the part of every real report that carries no information, and an adversary who knows
every real report but the victim's still faces the victim's report among m draws of B
(``transforms.privacy.blanket``; Balle, Bell, Gascón, Nissim, *The Privacy Blanket of the Shuffle Model*,
CRYPTO 2019). The analyzer knows m (the release publishes it) but not which reports are dummies, and removes
their expected counts (m B_c, B_c the probability that a dummy increments count cell c) before decoding;
their spread adds m B_c (1 - B_c) to each count's variance.

A mechanism declares the role by subclassing :class:`BlanketRandomizer`; ``require_blanket`` refuses any other
with a one-line error, so a spec that asks for dummies on a mechanism without an accounted blanket fails when
it is loaded, not in the ledger. Supported: GRR (k-ary randomized response, binary RR being d = 2) and OUE,
the randomizers whose view among dummies this project accounts exactly (the reasons for the others are in
docs/mathematics.md §1.7).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

from transforms.mechanisms.base import FrequencyEstimate, Randomness
from transforms.mechanisms.frequency.counting import rr_count_variance
from transforms.privacy.blanket import dummies_needed, epsilon_blanket

__all__ = [
    "BlanketRandomizer",
    "blanket_count_moments",
    "blanket_dummies_for",
    "check_dummies",
    "require_blanket",
    "rr_blanket_estimate",
]


def check_dummies(m: object) -> int:
    """A number of dummies: an int >= 0 (booleans and fractions refused)."""
    if isinstance(m, bool) or not isinstance(m, int | np.integer) or int(m) < 0:
        raise ValueError(f"the number of dummy reports must be an integer >= 0, got {m!r}")
    return int(m)


class BlanketRandomizer(ABC):
    """Role of a randomizer with a sampled blanket (see the module docstring); subclass it to declare it.

    The subclass names its exact accounting (``blanket_accounting``, a randomizer of
    ``transforms.privacy.blanket``) and is a randomized-response counter: its accumulator's count array is
    decoded by (C - n q)/(p - q) with the ``p``, ``q``, ``d`` and ``epsilon`` it exposes.
    """

    blanket_accounting: ClassVar[str]
    d: int
    epsilon: float
    p: float
    q: float

    @property
    @abstractmethod
    def blanket_weight(self) -> float:
        """gamma of R(x) = (1 - gamma) R'(x) + gamma B: the share of every real report that is blanket."""

    @property
    @abstractmethod
    def blanket_cell_probability(self) -> np.ndarray:
        """Probability that one dummy increments each cell of the accumulator's count array."""

    @abstractmethod
    def blanket_output_distribution(self) -> np.ndarray:
        """Law B of one dummy over the outputs, indexed like the mechanism's ``exact_output_distribution``."""

    @abstractmethod
    def blanket_reports(self, m: int, rng: Randomness) -> np.ndarray:
        """m dummy reports drawn independently from B, same dtype as ``encode``'s reports (valid reports)."""

    def blanket_epsilon(self, m: int, delta: float, reports_per_client: int = 1) -> float:
        """Central epsilon (replacement) of one device's reports among m dummies, whoever else colludes."""
        return epsilon_blanket(self.d, self.epsilon, check_dummies(m), delta, reports_per_client,
                               randomizer=self.blanket_accounting)

    def dummies_needed(self, eps_target: float, delta: float, reports_per_client: int = 1) -> int:
        """Smallest m whose ``blanket_epsilon`` is at most ``eps_target``."""
        return dummies_needed(self.d, self.epsilon, eps_target, delta, reports_per_client,
                              randomizer=self.blanket_accounting)

    def blanket_estimate(self, counts: np.ndarray, released: int, m: int) -> FrequencyEstimate:
        """Unbiased estimate from the count array of a release of ``released`` reports, m of them dummies."""
        return rr_blanket_estimate(counts, released, m, self.p, self.q, self.blanket_cell_probability)


def require_blanket(mechanism: Any) -> BlanketRandomizer:
    """``mechanism`` as a blanket randomizer, or a one-line error saying it has none."""
    if isinstance(mechanism, BlanketRandomizer):
        return mechanism
    name = getattr(mechanism, "name", type(mechanism).__name__)
    raise ValueError(
        f"mechanism {name!r} has no accounted blanket component, so the shuffler cannot add dummy reports "
        "for it (supported: grr, oue)"
    )


def blanket_dummies_for(mechanism: Any, eps_target: float | None, delta: float, reports_per_client: int,
                        dummies: int = 0) -> int:
    """The dummies per release a spec asks for: the smallest m reaching ``eps_target`` (or ``dummies`` as given).

    One report per device per window only: the shuffler keeps a device's reports in one sub-crowd, so with
    k > 1 the release's order is not a uniform permutation of its messages and the dummies would not be
    exchangeable with a device's other reports (``transforms.shuffler.blanket`` needs that exchangeability).
    """
    role = require_blanket(mechanism)
    if reports_per_client != 1:
        raise ValueError("a blanket needs max_reports_per_window = 1 (the shuffler keeps a device's reports "
                         f"together, so dummies would not hide one of them; got {reports_per_client})")
    if eps_target is None:
        return check_dummies(dummies)
    return role.dummies_needed(eps_target, delta, 1)


def blanket_count_moments(m: int, cell_probability: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, variance) of each cell's count among m independent dummies, each incrementing cell c w.p. B_c:
    m B_c and m B_c (1 - B_c) (a sum of m independent Bernoulli variables per cell)."""
    m = check_dummies(m)
    b = np.asarray(cell_probability, dtype=np.float64)
    return m * b, m * b * (1.0 - b)


def rr_blanket_estimate(counts: np.ndarray, released: int, m: int, p: float, q: float,
                        cell_probability: np.ndarray) -> FrequencyEstimate:
    """Debias a randomized-response count array whose release held m dummies (each incrementing cell c w.p. B_c).

    With n = released - m real reports, E[C] = n q + (p - q) c + m B, so (C - m B - n q)/(p - q) is unbiased
    for the true counts c. Real reports and dummies are independent, so the variance is the mechanism's
    closed form for n reports (docs/mathematics.md §2.1) plus m B (1 - B) / (p - q)^2; the standard error is
    that variance at the plug-in counts, as for a release without dummies.
    """
    m = check_dummies(m)
    released = int(released)
    n = released - m
    if n < 1:
        raise ValueError(f"a release of {released} reports with {m} dummies holds no real report")
    mean, spread = blanket_count_moments(m, cell_probability)
    c = np.asarray(counts, dtype=np.float64)
    if c.shape != mean.shape:
        raise ValueError(f"counts of shape {c.shape} do not match the blanket's cells {mean.shape}")
    gap = p - q
    count = (c - mean - n * q) / gap
    plug_in = np.clip(count, 0.0, float(n))
    added = spread / gap**2
    variance = rr_count_variance(plug_in, n, p, q) + added
    return FrequencyEstimate(count=count, frequency=count / n, stderr=np.sqrt(variance) / n, n=n,
                             extras={"blanket_dummies": m, "blanket_added_variance": added})
