"""LDP-SGD client randomizer and mean-gradient analyzer ([ESA] Alg. 4-5, docs/mathematics.md §4.2) [P*].

Client: clip the gradient to L2 norm ``clip`` = L; ``z = +-L x/|x|`` with P(+) = 1/2 + |x|/(2L) (so E z = x);
draw v uniform on the unit sphere; report ``z_hat = sgn<z, v> v`` w.p. ``e^eps/(1 + e^eps)``, else its negation.
Analyzer: ``g = c mean(z_hat)``, ``c = kappa_d L (e^eps + 1)/(e^eps - 1)``, ``kappa_d = sqrt(pi) G((d+1)/2)/G(d/2)``
-- [ESA] prints kappa without the factor d, which biases g by 1/d (checked against the exact E|<u, v>|
   for d = 1, 2, 3); corrected here.
``E[z_hat | x] = x/c`` exactly, so g is unbiased for the mean clipped gradient.

Message: payload ``vector``, the d doubles of ``z_hat`` ([ESA]'s 129-bit sign + PRG-seed form would need a shared
PRG; not implemented). Output density w.r.t. the uniform measure on the sphere is ``2[a p + (1-a)(1-p)]`` on the
hemisphere ``<u, w> > 0`` and ``2[a(1-p) + (1-a)p]`` on the other (u = x/|x|, a = 1/2 + |x|/(2L)), whence
eps-LDP (ratio <= p/(1-p)) and the generic mixture alpha (attained by x = -x' at full norm).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from transforms.mechanisms.base import Randomizer, Randomness, VectorEstimate, check_epsilon
from transforms.mechanisms.frequency.counting import (
    check_mergeable,
    empty_mask_if_malformed,
    exp_epsilon,
    refuse_invalid,
    structured,
)
from transforms.privacy.mixture import alpha_generic

__all__ = ["LdpSgdAccumulator", "LdpSgdRandomizer", "kappa"]

UNIT_TOLERANCE = 1e-9  # |‖z_hat‖ - 1| allowed by validate (float rounding of a normalised vector)


def kappa(d: int) -> float:
    """``kappa_d = 1/E|v_1|`` for v uniform on the unit sphere of R^d (d=1: 1, d=2: pi/2, d=3: 2)."""
    return math.sqrt(math.pi) * math.exp(math.lgamma((d + 1) / 2) - math.lgamma(d / 2))


@dataclass(frozen=True)
class LdpSgdRandomizer(Randomizer):
    """One eps-LDP unit-vector report of a clipped gradient; d doubles per report, O(d) per client."""

    name: ClassVar[str] = "ldp_sgd"
    payload_kind: ClassVar[str] = "vector"
    d: int
    epsilon: float
    clip: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.d, bool) or int(self.d) != self.d or self.d < 1:
            raise ValueError(f"dimension d must be an integer >= 1, got {self.d!r}")
        check_epsilon(self.epsilon)
        exp_epsilon(self.epsilon)
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"clip (L2 bound L) must be a finite number > 0, got {self.clip!r}")
        object.__setattr__(self, "d", int(self.d))
        object.__setattr__(self, "epsilon", float(self.epsilon))
        object.__setattr__(self, "clip", float(self.clip))

    @property
    def p(self) -> float:
        """Probability of keeping the hemisphere of z, e^eps/(1 + e^eps)."""
        return 1.0 / (1.0 + math.exp(-self.epsilon))

    @property
    def scale(self) -> float:
        """``c = kappa_d L (e^eps + 1)/(e^eps - 1)``: ``E[c z_hat] = x``."""
        return kappa(self.d) * self.clip / math.tanh(self.epsilon / 2)

    @property
    def report_dtype(self) -> np.dtype:
        return np.dtype([("values", "<f8", (self.d,))])

    @property
    def epsilon_local(self) -> float:
        return self.epsilon

    @property
    def mixture_alpha(self) -> float:
        return alpha_generic(self.epsilon)  # TV of x = -x' at full norm is tanh(eps/2): generic is exact

    @property
    def message_bits(self) -> int:
        return 64 * self.d

    def clip_gradients(self, gradients: np.ndarray) -> np.ndarray:
        """``g min(1, L/|g|)`` row-wise, refusing non-finite gradients and wrong shapes."""
        g = np.asarray(gradients, dtype=np.float64)
        if g.ndim != 2 or g.shape[1] != self.d:
            raise ValueError(f"gradients must have shape [n, d] = [n, {self.d}], got {g.shape}")
        if not np.all(np.isfinite(g)):
            raise ValueError("gradients must be finite")
        norm = np.linalg.norm(g, axis=1, keepdims=True)
        return g * np.minimum(1.0, self.clip / np.maximum(norm, 1e-300))

    def encode(self, gradients: np.ndarray, rng: Randomness) -> np.ndarray:
        x = self.clip_gradients(gradients)
        n = x.shape[0]
        norm = np.linalg.norm(x, axis=1)
        u = np.zeros_like(x)
        u[:, 0] = 1.0  # any direction for a zero gradient: z is then +-L u with probability 1/2 each
        nz = norm > 0
        u[nz] = x[nz] / norm[nz, None]
        z_sign = np.where(rng.random(n) < 0.5 + norm / (2 * self.clip), 1.0, -1.0)
        v = self._sphere(n, rng)
        side = np.where(np.einsum("ij,ij->i", u, v) >= 0, 1.0, -1.0) * z_sign  # sgn <z, v>
        keep = np.where(rng.random(n) < self.p, 1.0, -1.0)
        return structured(self.report_dtype, values=(side * keep)[:, None] * v)

    def _sphere(self, n: int, rng: Randomness) -> np.ndarray:
        """Uniform unit vectors: Box-Muller normals from ``ceil(d/2)`` uniform pairs per client, normalised."""
        pairs = -(-self.d // 2)
        radius = np.sqrt(-2.0 * np.log1p(-rng.random((n, pairs))))
        angle = 2.0 * math.pi * rng.random((n, pairs))
        normals = np.concatenate([radius * np.cos(angle), radius * np.sin(angle)], axis=1)[:, : self.d]
        length = np.linalg.norm(normals, axis=1, keepdims=True)
        degenerate = length[:, 0] == 0  # probability ~2^-53 per client: fall back to a fixed direction
        normals[degenerate, 0], length[degenerate] = 1.0, 1.0
        return normals / length

    def validate(self, reports: np.ndarray) -> np.ndarray:
        """Finite unit vectors (the only outputs of the randomizer)."""
        bad = empty_mask_if_malformed(reports, self.report_dtype)
        if bad is not None:
            return bad
        vals = reports["values"]
        with np.errstate(invalid="ignore"):
            finite = np.all(np.isfinite(vals), axis=1)
            norm = np.linalg.norm(np.where(np.isfinite(vals), vals, 0.0), axis=1)
        return finite & (np.abs(norm - 1.0) <= UNIT_TOLERANCE)

    def new_accumulator(self) -> LdpSgdAccumulator:
        return LdpSgdAccumulator(self)

    def variance(self, gradients: np.ndarray) -> np.ndarray:
        """Exact variance ``[d]`` of the mean-gradient estimate: ``(1/n^2) sum_i (c^2/d - x_ij^2)`` (x clipped),
        because ``E[z_hat z_hat^T] = E[v v^T] = I/d`` whatever the signs."""
        x = self.clip_gradients(gradients)
        return (self.scale**2 / self.d - x**2).sum(axis=0) / x.shape[0] ** 2

    def worst_case_variance(self, n: int) -> float:
        """``c^2/(d n)``: the variance bound used for published standard errors (exact variance minus
        ``mean_i x_ij^2 / n``, so at most a factor ``c^2/(c^2 - d L^2)`` too large)."""
        return self.scale**2 / (self.d * n)

    def parameters(self) -> dict[str, Any]:
        return {"d": self.d, "epsilon": self.epsilon, "clip": self.clip}

    def exact_output_density(self, gradient: np.ndarray, w: np.ndarray) -> np.ndarray:
        """Density of z_hat at unit vectors ``w`` [m, d] w.r.t. the uniform probability on the sphere (d = 1:
        the probabilities of w = -1, +1 times 2)."""
        x = self.clip_gradients(np.asarray(gradient, dtype=np.float64).reshape(1, -1))[0]
        norm = float(np.linalg.norm(x))
        u = x / norm if norm > 0 else np.eye(self.d)[0]
        a, p = 0.5 + norm / (2 * self.clip), self.p
        same = 2 * (a * p + (1 - a) * (1 - p))
        return np.where(np.asarray(w) @ u >= 0, same, 2.0 - same)


class LdpSgdAccumulator:
    """Sum of reported unit vectors (float64 [d]) and their number; ``estimate`` = c * sum / n."""

    def __init__(self, mechanism: LdpSgdRandomizer) -> None:
        self.mechanism = mechanism
        self.total = np.zeros(mechanism.d)
        self.n = 0

    def add(self, reports: np.ndarray, clients: int | None = None) -> None:
        """Fold validated reports in; refuse invalid ones rather than let them bias the gradient."""
        arr = np.asarray(reports)
        if arr.size == 0:
            return
        refuse_invalid(self.mechanism.validate(arr), f"reports are not unit vectors of dimension {self.mechanism.d}")
        self.total += arr["values"].sum(axis=0)
        self.n += int(arr.size)

    def merge(self, other: Any) -> None:
        check_mergeable(self, other)
        self.total += other.total
        self.n += other.n

    def estimate(self) -> VectorEstimate:
        """Unbiased mean clipped gradient; stderr from the data-free bound ``c^2/(d n)`` (see worst_case_variance)."""
        if self.n == 0:
            raise ValueError("no reports")
        m = self.mechanism
        se = math.sqrt(m.worst_case_variance(self.n))
        return VectorEstimate(mean=m.scale * self.total / self.n, stderr=np.full(m.d, se), n=self.n,
                              extras={"sum_of_reports": self.total.copy(), "scale": m.scale})

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.mechanism!r}, n={self.n})"
