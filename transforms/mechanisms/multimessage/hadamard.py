"""Private-coin multi-message Hadamard response ([MultiMsg] §4.1, Alg. 1; docs/mathematics.md §7.1).

Order ``B' = 2^ceil(log2(d + k_set + 1))``; item j owns the codeword support
``C_j = {u in [B'] : popcount((j + 1) & u) even}`` (row 0 of the Sylvester matrix, all ones, is skipped;
items d .. d+k_set-1 are the dummies that pad every set to exactly k_set elements). A client sends, for each
element j of its padded set, ONE message of tau indices ``u_r ~ Unif(C_j)``, plus ``rho`` blanket messages of
tau uniform indices: ``k_set + rho`` messages of ``tau log2 B'`` bits, always the same number.

**Sampling Unif(C_j)**: draw u uniform on [B'] and, if it is outside C_j, flip the lowest set bit of j + 1:
that flips the parity of ``(j + 1) & u``, a bijection between C_j and its complement.

**Decoding**: the items supported by a message ``(u_1..u_tau)`` are ``{j : (j + 1) . u_r = 0 over GF(2) for
all r}``, the kernel of a ``tau x log2 B'`` bit matrix ([MultiMsg] Lemma 4.6). We eliminate all messages of a batch
at once, bit-sliced (64 messages per uint64 word, one vectorised pass per row), and enumerate each kernel
(``~ B' 2^-tau`` elements, plus the true item), so the analyzer keeps only a count per item.
``c_j`` counts the messages supporting j and ``x_hat_j = (c_j - n (k_set + rho) 2^-tau) / (1 - 2^-tau)`` is
unbiased with the exact variance ``(n (k_set + rho) - x_j) 2^-tau / (1 - 2^-tau)``: every message not sent for
j is independently in ``C_j^tau`` with probability exactly 2^-tau (distinct non-zero rows share B'/4 of their
supports).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from transforms.mechanisms.base import Randomness
from transforms.mechanisms.frequency.counting import empty_mask_if_malformed, structured
from transforms.mechanisms.multimessage.common import (
    MessageAccumulator,
    ShuffleOnlyProtocol,
    ceil_log2,
    check_positive_int,
    check_sets,
    parity,
)
from transforms.privacy.multimessage import (
    hadamard_default_tau,
    hadamard_delta,
    hadamard_epsilon,
    hadamard_min_rho,
    hadamard_paper_rho,
)

__all__ = ["MultiMessageHadamard", "MultiMessageHadamardAccumulator", "kernel_items"]

MAX_ORDER_BITS = 31  # indices travel as longs; KeyedRandom draws ranges up to 2^32
MAX_TAU = 62
MAX_ENUMERATED_OUTCOMES = 1 << 20
_DECODE_CHUNK = 1 << 17  # messages row-reduced at once (bit-sliced, 64 per word)
_ALL_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)
_KERNEL_CELLS = 1 << 22  # (messages x kernel size) enumerated at once


def kernel_items(values: np.ndarray, bits: int, limit: int) -> np.ndarray:
    """Items j < limit supported by each message (all ``(j + 1) . u_r = 0`` over GF(2)), concatenated.

    ``values`` is an ``(M, tau)`` int64 array of indices in [2^bits). Returns a 1-D int64 array with one entry
    per (message, supported item) pair, in no particular order.
    """
    out = [_kernel_chunk(values[s : s + _DECODE_CHUNK], bits, limit) for s in range(0, len(values), _DECODE_CHUNK)]
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def _kernel_chunk(values: np.ndarray, bits: int, limit: int) -> np.ndarray:
    """Null space of every message's ``tau x bits`` matrix by column elimination, 64 messages per word.

    Bit-sliced: ``cols[b, r]`` packs bit b of ``u_r`` of 64 messages into one uint64, ``labels[b, b']`` the
    combination of original columns that column b now holds. For each row r, every message picks its first
    live column with a 1 in row r as pivot, XORs it into its other live columns with a 1 there, and retires
    it. Live columns left at the end are zero in every row: their labels span the kernel.
    """
    m, tau = values.shape
    words = -(-m // 64)
    padded = np.zeros((tau, words * 64), dtype=np.uint32)
    padded[:, :m] = values.T
    cols = np.empty((bits, tau, words), dtype=np.uint64)
    for b in range(bits):
        cols[b] = np.packbits((padded & np.uint32(1 << b)) != 0, axis=-1, bitorder="little").view("<u8")
    labels = np.zeros((bits, bits, words), dtype=np.uint64)
    labels[np.arange(bits), np.arange(bits)] = _ALL_ONES
    live_mask = np.packbits(np.arange(words * 64) < m, bitorder="little").view("<u8")  # no padding messages
    live = np.broadcast_to(live_mask, (bits, words)).copy()
    for r in range(tau):
        has = cols[:, r, :] & live
        pivot = has.copy()
        pivot[1:] &= ~np.bitwise_or.accumulate(has, axis=0)[:-1]  # first candidate column per message
        fix = has & ~pivot
        if r + 1 < tau:
            cols[:, r + 1 :, :] ^= fix[:, None, :] & np.bitwise_or.reduce(pivot[:, None, :] & cols[:, r + 1 :, :], 0)
        labels ^= fix[:, None, :] & np.bitwise_or.reduce(pivot[:, None, :] & labels, axis=0)
        live &= ~pivot
    live_bits = np.unpackbits(live.view(np.uint8), axis=-1, bitorder="little")[:, :m].astype(bool)  # (bits, m)
    dims = live_bits.sum(axis=0)
    chosen = np.nonzero(dims > 0)[0]
    if chosen.size == 0:
        return np.zeros(0, np.int64)
    kernel = np.empty((chosen.size, bits), dtype=np.int64)
    for b in range(bits):  # label of column b of each message, as an integer
        label_bits = np.unpackbits(labels[b].view(np.uint8), axis=-1, bitorder="little")[:, :m]
        label = np.zeros(m, dtype=np.int32)  # bits <= 31
        for i in range(bits):
            label |= label_bits[i].astype(np.int32) << i
        kernel[:, b] = label[chosen]
    live_sel, dims = live_bits[:, chosen].T, dims[chosen]
    found_items = []
    for dim in np.unique(dims):
        sel = np.nonzero(dims == dim)[0]
        rows_, cols_ = np.nonzero(live_sel[sel])  # row-major: each message's live columns, in order
        vectors = kernel[sel[rows_], cols_].reshape(sel.size, int(dim))
        step = max(1, _KERNEL_CELLS >> int(dim))
        for s in range(0, len(sel), step):
            span = np.zeros((min(step, len(sel) - s), 1), dtype=np.int64)
            for i in range(int(dim)):
                span = np.concatenate([span, span ^ vectors[s : s + step, i : i + 1]], axis=1)
            items = span[:, 1:].ravel() - 1  # drop the zero vector (row 0 is never a codeword)
            found_items.append(items[items < limit])
    return np.concatenate(found_items) if found_items else np.zeros(0, np.int64)


@dataclass(frozen=True)
class MultiMessageHadamard(ShuffleOnlyProtocol):
    """[MultiMsg] §4.1: k_set + rho anonymous messages per client, error O(sqrt(k_set + rho)), independent of d.

    ``rho`` (blanket messages) defaults to the least value the exact numeric accountant certifies for
    ``(epsilon, delta)`` at ``n_expected`` clients (``calibration="numeric"``) or the paper-style Chernoff rule
    (``"paper"``, ~10x more); ``tau`` defaults to floor(log2 n_expected). Explicit ``rho``/``tau`` are used as
    given: ``ledger``/``epsilon_central`` then say what they certify.
    """

    accounts_central: ClassVar[bool] = True  # epsilon_central is its own accounting

    name: ClassVar[str] = "mm_hadamard"
    payload_kind: ClassVar[str] = "integers"
    single_message: ClassVar[bool] = False
    channels: ClassVar[int] = 1
    d: int
    epsilon: float
    delta: float
    n_expected: int
    k_set: int = 1
    rho: int | None = None
    tau: int | None = None
    calibration: str = "numeric"

    def __post_init__(self) -> None:
        self._freeze_protocol()
        if self.order_bits > MAX_ORDER_BITS:
            raise ValueError(f"d + k_set = {self.d + self.k_set} needs a Hadamard order above 2^{MAX_ORDER_BITS}")
        tau = hadamard_default_tau(self.n_expected) if self.tau is None else self.tau
        object.__setattr__(self, "tau", check_positive_int("tau", tau))
        if self.tau_ > MAX_TAU:
            raise ValueError(f"tau must be <= {MAX_TAU}, got {self.tau_}")
        if self.rho is None:
            rho = (hadamard_paper_rho(self.epsilon, self.delta, self.k_set) if self.calibration == "paper"
                   else hadamard_min_rho(self.n_expected, self.tau_, self.k_set, self.epsilon, self.delta))
        else:
            rho = self.rho
        object.__setattr__(self, "rho", check_positive_int("rho (blanket messages per client)", rho))

    # -- public parameters --------------------------------------------------------------------------------

    @property
    def tau_(self) -> int:
        assert self.tau is not None
        return int(self.tau)

    @property
    def rho_(self) -> int:
        assert self.rho is not None
        return int(self.rho)

    @property
    def order_bits(self) -> int:
        """log2 B', B' = 2^ceil(log2(d + k_set + 1))."""
        return ceil_log2(self.d + self.k_set + 1)

    @property
    def order(self) -> int:
        return 1 << self.order_bits

    @property
    def messages_per_client(self) -> int:
        return self.k_set + self.rho_

    @property
    def messages_per_channel(self) -> int:
        """Every client sends exactly k_set + rho messages (the shuffler's flood quota)."""
        return self.messages_per_client

    @property
    def report_dtype(self) -> np.dtype:
        return np.dtype([("channel", "<i8"), ("values", "<i8", (self.tau_,))])

    @property
    def message_bits(self) -> int:
        return self.tau_ * self.order_bits

    def parameters(self) -> dict[str, Any]:
        return {"d": self.d, "epsilon": self.epsilon, "delta": self.delta, "n_expected": self.n_expected,
                "k_set": self.k_set, "rho": self.rho_, "tau": self.tau_, "calibration": self.calibration}

    # -- privacy ------------------------------------------------------------------------------------------

    def epsilon_central(self, n: int, delta: float) -> float:
        """Certified central epsilon of n shuffled clients at ``delta`` (exact accountant, §7.1)."""
        return hadamard_epsilon(n, self.rho_, self.tau_, self.k_set, delta) if n >= 2 else float("inf")

    def delta_central(self, n: int, epsilon: float) -> float:
        return hadamard_delta(n, self.rho_, self.tau_, self.k_set, epsilon) if n >= 2 else 1.0

    def ledger(self, n: int | None = None) -> dict[str, Any]:
        """Cost and privacy of the protocol for n clients (default n_expected): paper rule vs numeric."""
        n = self.n_expected if n is None else check_positive_int("n", n, 2)
        rho_paper = hadamard_paper_rho(self.epsilon, self.delta, self.k_set)
        paper_claims = self.rho_ >= rho_paper and self.tau_ == hadamard_default_tau(n)
        return self._ledger(
            "[MultiMsg] §4.1 multi-message Hadamard response", n,
            float(self.messages_per_client), self.messages_per_client, paper_claims,
            paper_rule_rho=rho_paper,
            paper_rule_messages_per_client=self.k_set + rho_paper,
            rho=self.rho_,
            tau=self.tau_,
            order=self.order,
        )

    # -- client -------------------------------------------------------------------------------------------

    def encode_sets(self, sets: np.ndarray, rng: Randomness) -> tuple[np.ndarray, np.ndarray]:
        """Sets (``(n, k_set)`` int64, -1 = empty slot) -> ``k_set + rho`` messages per client, owner-consecutive.

        Draws: ``(n, k_set, tau)`` then ``(n, rho, tau)`` integers, whatever the data.
        """
        s = check_sets(sets, self.d, self.k_set)
        n, k, tau = s.shape[0], self.k_set, self.tau_
        padded = np.where(s >= 0, s, self.d + np.arange(k))  # distinct dummies d .. d+k-1
        row = padded + 1
        flip = row & -row  # lowest set bit of the codeword row
        u = rng.integers(0, self.order, (n, k, tau))
        u = u ^ (flip[:, :, None] * parity(u & row[:, :, None]))
        blanket = rng.integers(0, self.order, (n, self.rho_, tau))
        messages = np.concatenate([u, blanket], axis=1).reshape(n * self.messages_per_client, tau)
        reports = structured(self.report_dtype, channel=np.zeros(len(messages), np.int64), values=messages)
        return reports, np.repeat(np.arange(n, dtype=np.int64), self.messages_per_client)

    def validate(self, reports: np.ndarray) -> np.ndarray:
        bad = empty_mask_if_malformed(reports, self.report_dtype)
        if bad is not None:
            return bad
        values = reports["values"]
        return (reports["channel"] == 0) & np.all((values >= 0) & (values < self.order), axis=1)

    # -- analyzer -----------------------------------------------------------------------------------------

    def new_accumulator(self) -> MultiMessageHadamardAccumulator:
        return MultiMessageHadamardAccumulator(self)

    def variance(self, counts: np.ndarray, n: int) -> np.ndarray:
        """Exact ``Var[x_hat_j] = (n (k_set + rho) - x_j) 2^-tau / (1 - 2^-tau)`` (§7.1)."""
        p = 2.0**-self.tau_
        return (n * self.messages_per_client - np.asarray(counts, dtype=np.float64)) * p / (1.0 - p)

    def supported_items(self, values: np.ndarray) -> np.ndarray:
        """Items (< d) supported by each message of an ``(M, tau)`` index array, concatenated."""
        return kernel_items(np.asarray(values, dtype=np.int64).reshape(-1, self.tau_), self.order_bits, self.d)

    # -- enumeration (tests) ------------------------------------------------------------------------------

    def exact_message_distribution(self, elements: int | list[int]) -> dict[tuple, float]:
        """P(multiset of one client's messages | its set) for tiny parameters: keys are sorted tuples of
        tau-tuples. The data message of element j is uniform on ``C_j^tau``; blanket messages on ``[B']^tau``."""
        elems = [int(elements)] if np.isscalar(elements) else [int(e) for e in elements]  # type: ignore[union-attr]
        padded = check_sets(np.array([elems + [-1] * (self.k_set - len(elems))]), self.d, self.k_set)[0]
        padded = np.where(padded >= 0, padded, self.d + np.arange(self.k_set))
        space = self.order**self.tau_
        if space ** self.messages_per_client > MAX_ENUMERATED_OUTCOMES:
            raise ValueError("too many outcomes to enumerate; use tiny d, tau and rho")
        tuples = list(itertools.product(range(self.order), repeat=self.tau_))
        uniform = {t: 1.0 / space for t in tuples}
        laws = []
        for j in padded:
            inside = [t for t in tuples if all(parity(np.int64(u & (j + 1))) == 0 for u in t)]
            laws.append({t: 1.0 / len(inside) for t in inside})
        laws += [uniform] * self.rho_
        out: dict[tuple, float] = {}
        for combo in itertools.product(*(law.items() for law in laws)):
            key = tuple(sorted(t for t, _ in combo))
            out[key] = out.get(key, 0.0) + float(np.prod([p for _, p in combo]))
        return out


class MultiMessageHadamardAccumulator(MessageAccumulator):
    """Per-item counts of supporting messages (kernel enumeration on add); decoded by the §7.1 correction."""

    mechanism: MultiMessageHadamard

    def __init__(self, mechanism: MultiMessageHadamard) -> None:
        super().__init__(mechanism, (mechanism.d,))

    def _count(self, reports: np.ndarray) -> np.ndarray:
        m = self.mechanism
        return np.bincount(m.supported_items(reports["values"]), minlength=m.d)

    def _decode(self) -> tuple[np.ndarray, dict[str, Any]]:
        m = self.mechanism
        p = 2.0**-m.tau_
        count = (self.counts - self.n * m.messages_per_client * p) / (1.0 - p)
        return count, {}
