"""Range counting with [MultiMsg]'s matrix mechanism on the multi-message Hadamard protocol
(docs/mathematics.md §7.3, §7.1).

A client holding leaf x in [0, 2^bits) turns it into its *set* of kept tree nodes -- the root plus its
ancestors that are left children (``left_children_tree.user_sets``; node ids per §7.3, ``k_set = bits + 1``,
slot l = level l, -1 where the ancestor is a right child) -- and sends the set with the private-coin
multi-message Hadamard protocol over the ``B = 2^bits`` node ids: ``bits + 1 + rho`` messages of tau indices,
always the same number, all on one shuffler channel. The analyzer decodes the protocol's unbiased node
counts and answers any range with <= 2 bits of them (coefficients +/-1), the error of a range being
O(sqrt(bits (bits + rho))) whatever n and B: no local randomizer, privacy comes from the shuffle only.

``epsilon``/``delta`` are the protocol's central target for a whole set (bits + 1 chained element swaps, the
matrix sensitivity of Lemma 5.4), certified at ``n_expected`` clients by the exact accountant
(``calibration="numeric"``) or by the paper's Chernoff rule (``"paper"``); ``epsilon_central``/``ledger`` say
what a given n certifies. The estimate is a :class:`~transforms.mechanisms.ranges.left_children_tree.LeftChildrenTree`
(range answers, quantiles, the full dyadic tree, rows) with exact standard errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import numpy as np

from transforms.mechanisms.base import Randomizer, Randomness, check_epsilon, check_values
from transforms.mechanisms.multimessage.common import check_positive_int
from transforms.mechanisms.multimessage.hadamard import MultiMessageHadamard, MultiMessageHadamardAccumulator
from transforms.mechanisms.ranges.dyadic import MAX_TREE_BITS
from transforms.mechanisms.ranges.left_children_tree import LeftChildrenTree, user_sets

__all__ = ["MultiMessageRange", "MultiMessageRangeAccumulator"]


@dataclass(frozen=True)
class MultiMessageRange(Randomizer):
    """[MultiMsg] §5.3 (1-D): leaf -> left-children node set -> multi-message Hadamard over 2^bits node ids.

    ``values`` for encode are leaf indices in [0, 2^bits) (``ranges.bucketize`` maps numbers to leaves).
    ``rho``/``tau`` default as in :class:`MultiMessageHadamard` with ``k_set = bits + 1`` and are stored resolved.
    """

    calibrated_to_central: ClassVar[bool] = True  # epsilon is the central target its noise is sized to

    accounts_central: ClassVar[bool] = True  # epsilon_central is its own accounting

    name: ClassVar[str] = "mm_range"
    payload_kind: ClassVar[str] = "integers"
    single_message: ClassVar[bool] = False
    channels: ClassVar[int] = 1
    bits: int
    epsilon: float
    delta: float
    n_expected: int
    rho: int | None = None
    tau: int | None = None
    calibration: str = "numeric"
    protocol: MultiMessageHadamard = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.bits, bool) or int(self.bits) != self.bits or not 1 <= self.bits <= MAX_TREE_BITS:
            raise ValueError(f"bits must be an integer in [1, {MAX_TREE_BITS}] (leaves = 2^bits), got {self.bits!r}")
        object.__setattr__(self, "bits", int(self.bits))
        check_epsilon(self.epsilon)
        protocol = MultiMessageHadamard(1 << self.bits, self.epsilon, self.delta, self.n_expected,
                                        k_set=self.bits + 1, rho=self.rho, tau=self.tau, calibration=self.calibration)
        object.__setattr__(self, "protocol", protocol)
        for name in ("epsilon", "delta", "n_expected", "rho", "tau"):  # normalised / resolved by the protocol
            object.__setattr__(self, name, getattr(protocol, name))

    def __getstate__(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    # -- public parameters --------------------------------------------------------------------------------

    @property
    def d(self) -> int:
        """Leaves (= node ids of the protocol)."""
        return 1 << self.bits

    @property
    def k_set(self) -> int:
        """Set size of every client (root + one slot per level): the matrix sensitivity bits + 1."""
        return self.bits + 1

    @property
    def messages_per_client(self) -> int:
        return self.protocol.messages_per_client

    @property
    def messages_per_channel(self) -> int:
        """Every client sends exactly bits + 1 + rho messages on the one channel (the shuffler's flood quota)."""
        return self.protocol.messages_per_channel

    @property
    def report_dtype(self) -> np.dtype:
        return self.protocol.report_dtype

    @property
    def message_bits(self) -> int:
        return self.protocol.message_bits

    @property
    def epsilon_local(self) -> float:
        """Not locally private (the data messages are in the clear until shuffled): inf, like the protocol."""
        return self.protocol.epsilon_local

    @property
    def mixture_alpha(self) -> float:
        """Not a single-message randomizer: use ``epsilon_central``."""
        return float("nan")

    def parameters(self) -> dict[str, Any]:
        return {"bits": self.bits, "epsilon": self.epsilon, "delta": self.delta, "n_expected": self.n_expected,
                "rho": self.rho, "tau": self.tau, "calibration": self.calibration}

    # -- privacy ------------------------------------------------------------------------------------------

    def epsilon_central(self, n: int, delta: float) -> float:
        """Certified central epsilon of n shuffled clients at ``delta`` (the protocol's, k_set = bits + 1)."""
        return self.protocol.epsilon_central(n, delta)

    def delta_central(self, n: int, epsilon: float) -> float:
        return self.protocol.delta_central(n, epsilon)

    def ledger(self, n: int | None = None) -> dict[str, Any]:
        """The protocol's ledger (k_set = bits + 1) plus the range structure."""
        out = self.protocol.ledger(n)
        out.update(protocol="[MultiMsg] §5.3 range counting (left-children matrix) on §4.1 multi-message Hadamard",
                   structure=LeftChildrenTree.structure, bits=self.bits, k_set=self.k_set,
                   range_terms_max=2 * self.bits)
        return out

    # -- client -------------------------------------------------------------------------------------------

    def user_sets(self, values: np.ndarray) -> np.ndarray:
        """``(n, bits + 1)`` node-id sets of a batch of leaves (slot l = level l, -1 = right-child ancestor)."""
        return user_sets(check_values(values, self.d), self.bits)

    def encode_messages(self, values: np.ndarray, rng: Randomness) -> tuple[np.ndarray, np.ndarray]:
        """Leaves (int64[n] in [0, 2^bits)) -> (messages, owner): bits + 1 + rho consecutive messages per client.

        Draws ``(n, bits + 1, tau)`` then ``(n, rho, tau)`` integers whatever the data (the protocol's).
        """
        return self.protocol.encode_sets(self.user_sets(values), rng)

    def encode(self, values: np.ndarray, rng: Randomness) -> np.ndarray:
        """All messages of the batch (owners dropped): see :meth:`encode_messages`."""
        return self.encode_messages(values, rng)[0]

    def validate(self, reports: np.ndarray) -> np.ndarray:
        return self.protocol.validate(reports)

    def exact_message_distribution(self, value: int) -> dict[tuple, float]:
        """Law of one client's message multiset for leaf ``value`` (tiny parameters; see the protocol's)."""
        sets = self.user_sets(np.array([value]))
        return self.protocol.exact_message_distribution(sets[0].tolist())

    # -- analyzer -----------------------------------------------------------------------------------------

    def new_accumulator(self) -> MultiMessageRangeAccumulator:
        return MultiMessageRangeAccumulator(self)

    def variance(self, counts: np.ndarray, n: int) -> np.ndarray:
        """Marginal variance of node estimates (the protocol's §7.1 closed form)."""
        return self.protocol.variance(counts, n)

    def variance_constants(self, n: int) -> tuple[float, float]:
        """(var_intercept, cov_beta) = (N p/(1-p), p/(1-p)), N = n (bits + 1 + rho) messages, p = 2^-tau."""
        p = 2.0 ** -self.protocol.tau_
        return n * self.messages_per_client * p / (1.0 - p), p / (1.0 - p)


class MultiMessageRangeAccumulator:
    """The protocol's per-node support counts and client count; merges by addition."""

    def __init__(self, mechanism: MultiMessageRange) -> None:
        self.mechanism = mechanism
        self.inner = MultiMessageHadamardAccumulator(mechanism.protocol)

    @property
    def n(self) -> int:
        return self.inner.n

    @property
    def messages(self) -> int:
        return self.inner.messages

    def add(self, reports: np.ndarray, clients: int | None = None) -> None:
        """Fold the (validated) messages of ``clients`` clients; the number of clients is required."""
        if clients is None:
            raise ValueError("mm_range: add(reports, clients) needs the number of clients whose messages these are "
                             "(the shuffler publishes it); it cannot be inferred from anonymous messages")
        self.inner.add(reports, check_positive_int("clients", clients, 0))

    def merge(self, other: MultiMessageRangeAccumulator) -> None:
        if type(other) is not type(self) or other.mechanism != self.mechanism:
            raise ValueError(f"cannot merge {other!r} into an accumulator of {self.mechanism!r}")
        self.inner.merge(other.inner)

    def estimate(self) -> LeftChildrenTree:
        """Unbiased node counts with the exact variance constants (see ``left_children_tree``)."""
        if self.n < 1:
            raise ValueError("mm_range: no clients")
        count = self.inner.estimate().count
        intercept, beta = self.mechanism.variance_constants(self.n)
        return LeftChildrenTree(bits=self.mechanism.bits, n=self.n, estimates=count, var_intercept=intercept,
                                cov_beta=beta)

    def __repr__(self) -> str:
        return f"MultiMessageRangeAccumulator({self.mechanism!r}, n={self.n})"
