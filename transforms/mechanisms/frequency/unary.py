"""[ESA]'s fragmented unary encodings as multi-message mechanisms (docs/mathematics.md §2.7, §2.8; [ESA] Alg. 1-2).

* :class:`AttributeFragmentedRappor` ("rappor"): binary RR with keep probability e^eps/(1+e^eps) on every bit
  of the one-hot vector; bit j travels alone on channel j, and only set bits are sent (a "mark" message whose
  channel is its whole content). Removal eps-LDP against the all-zero reference; replacement 2 eps.
* :class:`ReportFragmentedRappor` ("rappor_fragments"): per bit a permanent backstop RR(eps_b), then tau
  independent fragment RRs(eps_f) of the backstop bit; fragment i of bit j travels on channel i*d + j.

Both encode in O(#ones) per client by geometric skipping with fixed draw shapes (``unary_sampling``: the exact
law, its 2^-64 truncation caps and why they are post-processing). Analyzers keep count arrays plus the number
of clients ``n``, which the shuffler publishes: set bits alone cannot tell how many clients sent nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from numbers import Real
from typing import Any, ClassVar

import numpy as np

from transforms.mechanisms.base import Randomness, check_domain, check_values
from transforms.mechanisms.frequency.counting import freeze_domain_and_epsilon, rr_count_variance
from transforms.mechanisms.frequency.unary_counts import (
    CHANNEL_DTYPE,
    ChannelMessages,
    MessageCountAccumulator,
    channel_messages,
)
from transforms.mechanisms.frequency.unary_sampling import (
    OVERFLOW_TAIL,
    bernoulli_positions,
    first_keys,
    first_ones_index,
    keys_to_padded,
    merge_keys,
    ones_cap,
    padded_to_keys,
    pattern_law,
    pushforward,
    row_ranks,
    unary_keys,
)
from transforms.privacy.binomial import binom_sf
from transforms.privacy.composition import fragment_epsilon
from transforms.privacy.fragments import default_fragment_epsilon, replacement_tight
from transforms.privacy.mixture import alpha_binary_rr
from transforms.privacy.shuffle_bound import epsilon_central as tight_removal

__all__ = [
    "MAX_UNARY_EPSILON",
    "AttributeFragmentedRappor",
    "MessageCountAccumulator",
    "ReportFragmentedRappor",
]

# Flip probabilities 1/(1+e^eps) below ~2e-9 are not represented accurately by 53-bit uniforms (relative error
# 2^-53/q on the flip probability): refuse such budgets rather than silently randomize at a different eps.
MAX_UNARY_EPSILON = 20.0


def _check_budget(name: str, eps: float) -> float:
    if isinstance(eps, bool) or not isinstance(eps, Real) or not math.isfinite(eps) or eps <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {eps!r}")
    if eps > MAX_UNARY_EPSILON:
        raise ValueError(
            f"{name} must be <= {MAX_UNARY_EPSILON} (flip probability 1/(1+e^eps) below what 53-bit uniforms "
            f"represent accurately), got {eps!r}"
        )
    return float(eps)


@dataclass(frozen=True)
class AttributeFragmentedRappor(ChannelMessages):
    """Attribute-fragmented k-RAPPOR ([ESA] Alg. 1): one "mark" message on channel j per randomized bit j set.

    ``epsilon`` is a removal budget (reference: RR of the all-zero vector); replacement LDP is 2 eps.
    Expected messages per client ``p + (d - 1) q``; variance of each frequency ``e^eps/(n (e^eps - 1)^2)``.
    """

    accounts_central: ClassVar[bool] = True  # epsilon_central is its own accounting

    name: ClassVar[str] = "rappor"
    payload_kind: ClassVar[str] = "mark"
    single_message: ClassVar[bool] = False
    messages_per_channel: ClassVar[int] = 1
    d: int
    epsilon: float

    def __post_init__(self) -> None:
        freeze_domain_and_epsilon(self)
        _check_budget("epsilon", self.epsilon)

    @property
    def q(self) -> float:
        """Flip probability 1/(1 + e^eps): a bit other than the value's is set w.p. q."""
        return alpha_binary_rr(self.epsilon)

    @property
    def p(self) -> float:
        """Keep probability e^eps/(1 + e^eps) of the value's own bit."""
        return 1.0 - self.q

    @property
    def channels(self) -> int:
        return self.d

    @cached_property
    def cap(self) -> int:
        """Most messages one client sends: P(more set bits) < 2^-64, else d (see ``unary_sampling``)."""
        return ones_cap(self.d, self.q)

    @property
    def overflow_probability(self) -> float:
        """Upper bound on P(a client's vector has more than ``cap`` ones) (0 when cap = d)."""
        return 0.0 if self.cap >= self.d else float(binom_sf(np.array(self.cap - 1.0), self.d - 1, self.q)[()])

    @property
    def expected_messages(self) -> float:
        return self.p + (self.d - 1) * self.q

    @property
    def report_dtype(self) -> np.dtype:
        return CHANNEL_DTYPE

    @property
    def epsilon_local(self) -> float:
        """Removal LDP ([ESA]'s model, tight); the replacement budget is ``epsilon_replacement`` = 2 eps."""
        return self.epsilon

    @property
    def epsilon_replacement(self) -> float:
        return 2.0 * self.epsilon

    @property
    def mixture_alpha(self) -> float:
        """1/(e^eps + 1) *per channel*: each channel is binary RR of one bit of every client. With
        ``epsilon_local`` it gives the tight removal central bound of the whole report (a removal changes one
        channel); replacement changes two channels: compose (2 eps_c, 2 delta)."""
        return alpha_binary_rr(self.epsilon)

    def epsilon_central(self, n: int, delta: float) -> float:
        """Replacement central epsilon of n shuffled clients (the ledger column: replacement DP like every other
        mechanism): two channels change, composed tightly (``fragments.replacement_tight``)."""
        return replacement_tight(n, self.mixture_alpha, self.epsilon_local, delta)

    def epsilon_central_removal(self, n: int, delta: float) -> float:
        """[ESA]'s removal central epsilon (one channel changes), tight §1.2 bound: for ``parameters`` only."""
        return tight_removal(n, self.mixture_alpha, self.epsilon_local, delta)

    @property
    def message_bits(self) -> int:
        return (self.d - 1).bit_length()  # the channel id is the whole message

    def encode_messages(self, values: np.ndarray, rng: Randomness) -> tuple[np.ndarray, np.ndarray]:
        """(reports, owner): one message per set bit, a client's messages consecutive, channels ascending.
        Draws per client: 1 + min(cap, d - 1) uniforms, whatever the value."""
        v = check_values(values, self.d)
        owner, channel = np.divmod(unary_keys(v, rng, self.d, self.p, self.q, self.cap), self.d)
        return channel_messages(channel, owner)

    def variance(self, counts: np.ndarray, n: int) -> np.ndarray:
        """Count variance ``n e^eps/(e^eps - 1)^2`` of every item (p = 1 - q makes it data-independent)."""
        return rr_count_variance(counts, n, self.p, self.q)

    def decode(self, counts: np.ndarray, n: int) -> np.ndarray:
        """Unbiased counts ``(C - n q)/(p - q)`` ([ESA] §III estimator times n)."""
        return (np.asarray(counts, dtype=np.float64) - n * self.q) / (self.p - self.q)

    def parameters(self) -> dict[str, Any]:
        return {"d": self.d, "epsilon": self.epsilon}

    def _law(self, one_prob: np.ndarray) -> np.ndarray:
        return pushforward(pattern_law(one_prob), first_ones_index(self.d, self.cap))

    def exact_output_distribution(self, value: int) -> np.ndarray:
        """P(set of channels messaged = pattern k | value) for k in [2^d], bit j of k = channel j (d <= 12);
        includes the cap's truncation, so it is the law ``encode_messages`` implements."""
        check_values(np.array([value]), self.d)
        probs = np.full(self.d, self.q)
        probs[value] = self.p
        return self._law(probs)

    def exact_reference_distribution(self) -> np.ndarray:
        """The removal reference R0: the same randomizer applied to the all-zero vector."""
        return self._law(np.full(self.d, self.q))


@dataclass(frozen=True)
class ReportFragmentedRappor(ChannelMessages):
    """Report fragmenting with a privacy backstop ([ESA] Alg. 2) on every bit of the one-hot vector.

    Per bit j: backstop ``x'_j = RR(x_j; eps_b)``, then for i in [tau] fragment ``y_ij = RR(x'_j; eps_f)``;
    a "mark" message on channel ``i*d + j`` when ``y_ij = 1``. ``epsilon_fragment=None`` takes docs/mathematics.md
    §2.8's default rule. Budgets are removal budgets ([ESA]). [ESA]'s experiments use tau = 4, 16 and 256.

    **Permanent backstop.** Within one ``encode_messages`` call the backstop is drawn once per client and shared
    by its tau fragments. Across windows the *same* backstop must be reused, or fresh backstops compose and
    eps_b no longer caps the long-term loss: a device computes ``backstop_bits`` once, stores its row, and
    calls ``fragments_from_backstop`` with fresh randomness each window.

    **Caps** (``unary_sampling``). ``backstop_cap`` bounds the stored backstop ones (overflow probability
    < 2^-64/(1 + e^eps_b)) and ``fragment_cap`` each fragment's messages (< 2^-64). Both truncations are
    post-processing (of the backstop, of a fragment), so eps_b holds exactly. The finer eps(t) < eps_b of Thm IV.1
    rely on bits being independent instances, which a truncated backstop is not on its overflow event (adding
    the value's bit can push out another one); there they hold as (eps(t), delta) with delta < 2^-64.
    """

    accounts_central: ClassVar[bool] = True  # epsilon_central is its own accounting

    name: ClassVar[str] = "rappor_fragments"
    payload_kind: ClassVar[str] = "mark"
    single_message: ClassVar[bool] = False
    messages_per_channel: ClassVar[int] = 1
    d: int
    epsilon_backstop: float
    epsilon_fragment: float | None = None
    fragments: int = 4

    def __post_init__(self) -> None:
        tau = self.fragments
        if isinstance(tau, bool) or int(tau) != tau or tau < 1:
            raise ValueError(f"fragments (tau) must be an integer >= 1, got {tau!r}")
        object.__setattr__(self, "fragments", int(tau))
        eps_b = _check_budget("epsilon_backstop", self.epsilon_backstop)
        eps_f = default_fragment_epsilon(eps_b, self.fragments) if self.epsilon_fragment is None else (
            _check_budget("epsilon_fragment", self.epsilon_fragment))
        check_domain(self.d)
        object.__setattr__(self, "d", int(self.d))
        object.__setattr__(self, "epsilon_backstop", eps_b)
        object.__setattr__(self, "epsilon_fragment", float(eps_f))

    @property
    def epsilon(self) -> float:
        """The backstop budget (what the ``Mechanism`` protocol calls epsilon)."""
        return self.epsilon_backstop

    @property
    def eps_f(self) -> float:
        assert self.epsilon_fragment is not None  # resolved in __post_init__
        return self.epsilon_fragment

    @property
    def q_backstop(self) -> float:
        return alpha_binary_rr(self.epsilon_backstop)

    @property
    def q_fragment(self) -> float:
        return alpha_binary_rr(self.eps_f)

    @property
    def keep_boost(self) -> float:
        """r = 1 - e^-eps_f: a set backstop bit is reported w.p. q_f + (1 - q_f) r = p_f (noise OR boost)."""
        return -math.expm1(-self.eps_f)

    @property
    def q_composite(self) -> float:
        """P(fragment bit != true bit) = 1/(1 + e^eps(1)): one fragment is binary RR at eps(1)."""
        return alpha_binary_rr(self.epsilon_one_fragment)

    @property
    def channels(self) -> int:
        return self.fragments * self.d

    @cached_property
    def backstop_cap(self) -> int:
        """Most backstop ones stored: overflow < 2^-64/(1 + e^eps_b), which bounds the cap's effect on the
        eps(t) guarantees by delta < 2^-64 (module docstring of ``unary_sampling``; eps_b holds exactly)."""
        return ones_cap(self.d, self.q_backstop, OVERFLOW_TAIL / (1.0 + math.exp(self.epsilon_backstop)))

    @cached_property
    def fragment_cap(self) -> int:
        """Most messages per fragment: overflow < 2^-64 (a truncation of one fragment is post-processing)."""
        return ones_cap(self.d, self.q_composite)

    @property
    def expected_messages(self) -> float:
        return self.fragments * ((1.0 - self.q_composite) + (self.d - 1) * self.q_composite)

    def epsilon_exposed(self, t: int) -> float:
        """Removal LDP against an adversary holding t of the tau fragments ([ESA] Thm IV.1), log-space."""
        if isinstance(t, bool) or int(t) != t or not 0 <= t <= self.fragments:
            raise ValueError(f"t must be an integer in [0, {self.fragments}], got {t!r}")
        return fragment_epsilon(self.epsilon_backstop, self.eps_f, int(t))

    @property
    def epsilon_one_fragment(self) -> float:
        return self.epsilon_exposed(1)

    @property
    def epsilon_local(self) -> float:
        """eps(tau): removal LDP of all fragments together (<= eps_b); replacement is 2 eps(tau)."""
        return self.epsilon_exposed(self.fragments)

    @property
    def epsilon_replacement(self) -> float:
        return 2.0 * self.epsilon_local

    @property
    def mixture_alpha(self) -> float:
        """1/(e^eps(tau) + 1) for the tau-tuple of one bit (a binary-input eps(tau)-LDP randomizer); separately
        shuffled rows are a post-processing of jointly shuffled tuples, so with ``epsilon_local`` it gives a
        valid removal central bound (``transforms.privacy.fragments.fragments_tight``)."""
        return alpha_binary_rr(self.epsilon_local)

    def epsilon_central(self, n: int, delta: float) -> float:
        """Replacement central epsilon (ledger column): the two changed bits' tuples, composed tightly."""
        return replacement_tight(n, self.mixture_alpha, self.epsilon_local, delta)

    def epsilon_central_removal(self, n: int, delta: float) -> float:
        """Removal central epsilon ([ESA]'s model, tight §1.2 bound of the tuple): for ``parameters`` only."""
        return tight_removal(n, self.mixture_alpha, self.epsilon_local, delta)

    @property
    def message_bits(self) -> int:
        return (self.channels - 1).bit_length()

    @property
    def report_dtype(self) -> np.dtype:
        return CHANNEL_DTYPE

    @property
    def backstop_parameters(self) -> dict[str, Any]:
        """What the backstop's law depends on (d, eps_b), and nothing else: a stored backstop stays valid, and
        must be kept, across edits of the fragments (tau, eps_f) or of anything outside the randomizer."""
        return {"mechanism": self.name, "d": self.d, "epsilon_backstop": self.epsilon_backstop}

    def backstop_bits(self, values: np.ndarray, rng: Randomness) -> np.ndarray:
        """The permanent backstop of each client: (n, backstop_cap) int64, ascending set bits, padded with d.
        Draws 1 + min(backstop_cap, d - 1) uniforms per client."""
        v = check_values(values, self.d)
        keys = unary_keys(v, rng, self.d, 1.0 - self.q_backstop, self.q_backstop, self.backstop_cap)
        return keys_to_padded(keys, self.d, v.size, self.backstop_cap, self.d)

    def fragments_from_backstop(self, backstop: np.ndarray, rng: Randomness) -> tuple[np.ndarray, np.ndarray]:
        """(reports, owner) of one window from stored backstops. Per client and fragment: min(fragment_cap, d)
        noise gaps (Bernoulli(q_f) over all bits) and backstop_cap boost uniforms (r on backstop bits)."""
        rows = np.asarray(backstop)
        if rows.ndim != 2 or rows.shape[1] != self.backstop_cap or not np.issubdtype(rows.dtype, np.integer):
            raise ValueError(f"backstop must be an integer array of shape (n, {self.backstop_cap}) from backstop_bits")
        if rows.size and (rows.min() < 0 or rows.max() > self.d):
            raise ValueError(f"backstop entries must lie in [0, {self.d}] ({self.d} = padding)")
        rows = rows.astype(np.int64, copy=False)
        n, d, tau, cap = rows.shape[0], self.d, self.fragments, self.fragment_cap
        stored = rows < d
        backstop_keys = padded_to_keys(rows, d, d)  # row-major, like stored's True entries
        per_fragment = []  # (client, bit, rank within the client's fragment) of each fragment's messages
        for _ in range(tau):  # tau vectorised passes over the batch
            noise = bernoulli_positions(rng, n, d, self.q_fragment, min(cap, d))
            boosted = backstop_keys[(rng.random(rows.shape) < self.keep_boost)[stored]]
            keys = first_keys(merge_keys(padded_to_keys(noise, d, d), boosted), d, cap)
            owner, bit = np.divmod(keys, d)
            per_fragment.append((owner, bit, row_ranks(owner)))
        # Order messages by (client, fragment, bit) without sorting: offsets from per-(client, fragment) counts.
        sizes = np.stack([np.bincount(owner, minlength=n) for owner, _, _ in per_fragment], axis=1)
        starts = (np.cumsum(sizes.ravel()) - sizes.ravel()).reshape(n, tau)
        channel = np.empty(int(sizes.sum()), dtype=np.int64)
        owner_out = np.empty_like(channel)
        for i, (owner, bit, rank) in enumerate(per_fragment):
            at = starts[owner, i] + rank
            channel[at] = i * d + bit
            owner_out[at] = owner
        return channel_messages(channel, owner_out)

    def encode_messages(self, values: np.ndarray, rng: Randomness) -> tuple[np.ndarray, np.ndarray]:
        """Backstop then fragments with the same randomness source (one window, backstop not stored)."""
        return self.fragments_from_backstop(self.backstop_bits(values, rng), rng)

    def scaled_variance(self) -> float:
        """n Var[h_j] (docs/mathematics.md §2.8 [D✓]): backstop term plus fragment term / tau, data-independent."""
        e_b, e_f = math.exp(self.epsilon_backstop), math.exp(self.eps_f)
        m_b, m_f = math.expm1(self.epsilon_backstop), math.expm1(self.eps_f)
        return e_b / m_b**2 + e_f * (e_b + 1.0) ** 2 / (self.fragments * m_b**2 * m_f**2)

    def variance(self, counts: np.ndarray, n: int) -> np.ndarray:
        """Count variance n [e^b/(e^b-1)^2 + e^f (e^b+1)^2/(tau (e^b-1)^2 (e^f-1)^2)] of every item."""
        return np.full(np.shape(counts), n * self.scaled_variance())

    def decode(self, counts: np.ndarray, n: int) -> np.ndarray:
        """Mean over fragments of ``(C_i - n q)/(1 - 2q)``, q = 1/(1 + e^eps(1)) (the §2.8 estimator times n)."""
        q = self.q_composite
        per_fragment = (np.asarray(counts, dtype=np.float64).reshape(self.fragments, self.d) - n * q) / (1 - 2 * q)
        return per_fragment.mean(axis=0)

    def parameters(self) -> dict[str, Any]:
        return {"d": self.d, "epsilon_backstop": self.epsilon_backstop, "epsilon_fragment": self.eps_f,
                "fragments": self.fragments}

    def _law(self, backstop_one_prob: np.ndarray) -> np.ndarray:
        d, tau = self.d, self.fragments
        if tau * d > 12:
            raise ValueError(f"enumerating 2^(tau d) outputs needs tau * d <= 12, got {tau * d}")
        backstop = pushforward(pattern_law(backstop_one_prob), first_ones_index(d, self.backstop_cap))
        bits = (np.arange(2**d)[:, None] >> np.arange(d)[None, :]) & 1
        p_f, q_f = 1.0 - self.q_fragment, self.q_fragment
        index = first_ones_index(d, self.fragment_cap)
        kernel = np.stack([pushforward(pattern_law(np.where(b == 1, p_f, q_f)), index) for b in bits])
        out = np.zeros(2 ** (tau * d))
        for x, weight in enumerate(backstop):
            joint = kernel[x]
            for _ in range(tau - 1):
                joint = np.kron(kernel[x], joint)  # fragment i occupies bits [i d, (i + 1) d) of the index
            out += weight * joint
        return out

    def exact_output_distribution(self, value: int) -> np.ndarray:
        """P(messaged channels = pattern k | value), bit (i d + j) of k = fragment i of bit j (tau d <= 12);
        includes both caps' truncations, so it is the law ``encode_messages`` implements."""
        check_values(np.array([value]), self.d)
        probs = np.full(self.d, self.q_backstop)
        probs[value] = 1.0 - self.q_backstop
        return self._law(probs)

    def exact_reference_distribution(self) -> np.ndarray:
        """The removal reference: the same pipeline applied to the all-zero vector."""
        return self._law(np.full(self.d, self.q_backstop))
