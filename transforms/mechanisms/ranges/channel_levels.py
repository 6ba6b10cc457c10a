"""Shared plumbing of the multi-level mechanisms (``DyadicRange``, ``DyadicRectangle``, ``PrefixHeavyHitters``).

Each client sends ONE message on a uniformly drawn level ("sample", full epsilon) or one message on every level
("all", epsilon / L each). The helpers here are what that choice implies whatever the per-level oracle: how many
clients a batch of messages holds, the law of a client's message set, the central epsilon, and the per-level
oracle properties and accumulator of the mechanisms built on :class:`ChannelOracles`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from transforms.mechanisms.base import Randomizer, Randomness
from transforms.mechanisms.frequency.counting import check_mergeable
from transforms.mechanisms.ranges.channel_oracles import central_epsilon_sampled, central_epsilon_split

__all__ = [
    "ChannelAccumulator",
    "OracleLevels",
    "central_epsilon_levels",
    "clients_of_batch",
    "combine_channel_laws",
]


def central_epsilon_levels(mech: Any, alphas: list[float], n: int, delta: float) -> float:
    """Central epsilon of a multi-level mechanism (``levels`` "sample" or "all", ``channels``, ``mixture_alpha``,
    ``epsilon``, ``epsilon_message``) whose channel j has mixture alpha ``alphas[j]`` at ``epsilon_message``."""
    if mech.levels == "sample":
        return central_epsilon_sampled(n, mech.channels, mech.mixture_alpha, mech.epsilon, delta)
    return central_epsilon_split(n, alphas, mech.epsilon_message, delta)


def clients_of_batch(messages: int, channels: int, levels: str, clients: int | None) -> int:
    """Clients whose messages a batch holds: ``clients`` when given, else one message per client ("sample") or
    one per channel ("all", which then needs whole sets)."""
    if clients is not None:
        return int(clients)
    if levels == "all" and messages % channels:
        raise ValueError(f"'all' mode: {messages} messages are not whole sets of {channels}; pass clients")
    return messages if levels == "sample" else messages // channels


def combine_channel_laws(laws: list[np.ndarray], levels: str) -> np.ndarray:
    """Law of a client's message set from its per-channel laws. "sample": index ``j * K + y`` (K = the largest
    law's size, zero-padded), each channel with probability 1/J; "all": the outer product (channel 0 slowest)."""
    if levels == "sample":
        table = np.zeros((len(laws), max(law.size for law in laws)))
        for j, law in enumerate(laws):
            table[j, : law.size] = law / len(laws)
        return table.ravel()
    out = np.ones(1)
    for law in laws:
        out = np.multiply.outer(out, law).ravel()
    return out


class ChannelAccumulator:
    """Per-channel oracle counts (count arrays) and the number of clients; merges by addition.

    Shared by the multi-level mechanisms built on :class:`ChannelOracles` (``mechanism.oracles``, ``levels``,
    ``channels``); subclasses turn the counts into their own result in ``estimate``.
    """

    def __init__(self, mechanism: Any) -> None:
        self.mechanism = mechanism
        self.counts = mechanism.oracles.new_counts()
        self.n = 0

    def add(self, reports: np.ndarray, clients: int | None = None) -> None:
        """Fold the messages of ``clients`` clients. In "sample" mode a client sends exactly one message, so
        ``clients`` defaults to ``len(reports)``; in "all" mode it must be given (or equal len / L)."""
        arr = np.asarray(reports)
        m = self.mechanism
        clients = clients_of_batch(len(arr), m.channels, m.levels, clients)
        if arr.size:
            self.counts.add(arr)
        self.n += clients

    def merge(self, other: Any) -> None:
        check_mergeable(self, other)
        self.counts.merge(other.counts)
        self.n += other.n

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.mechanism!r}, n={self.n})"


class OracleLevels(Randomizer):
    """Mixin of the mechanisms whose levels are the channels of ``self.oracles`` (a :class:`ChannelOracles`):
    wire format, validation and privacy are the oracles'; ``levels``, ``channels``, ``epsilon`` and
    ``encode_messages`` come from the mechanism."""

    accounts_central: ClassVar[bool] = True  # epsilon_central is its own accounting

    @property
    def epsilon_message(self) -> float:
        """Budget of one message: all of epsilon ("sample") or epsilon / levels ("all")."""
        return self.epsilon if self.levels == "sample" else self.epsilon / self.channels  # type: ignore[attr-defined]

    @property
    def payload_kind(self) -> str:
        return self.oracles.payload_kind  # type: ignore[attr-defined, no-any-return]

    @property
    def bit_length(self) -> int:
        """``length`` of an OUE bits payload (vectors are padded to the largest level)."""
        return self.oracles.bit_length  # type: ignore[attr-defined, no-any-return]

    @property
    def report_dtype(self) -> np.dtype:
        return self.oracles.report_dtype  # type: ignore[attr-defined, no-any-return]

    @property
    def epsilon_local(self) -> float:
        """LDP of a client's whole message set: one eps message, or L messages of eps/L (basic composition)."""
        return self.epsilon  # type: ignore[attr-defined, no-any-return]

    @property
    def mixture_alpha(self) -> float:
        """Mixture parameter of ONE message at ``epsilon_message`` (worst level); see :meth:`epsilon_central`."""
        return self.oracles.mixture_alpha  # type: ignore[attr-defined, no-any-return]

    @property
    def message_bits(self) -> int:
        return self.oracles.message_bits  # type: ignore[attr-defined, no-any-return]

    def encode(self, values: np.ndarray, rng: Randomness) -> np.ndarray:
        """All messages of the batch (owners dropped): see ``encode_messages``."""
        return self.encode_messages(values, rng)[0]  # type: ignore[attr-defined, no-any-return]

    def validate(self, reports: np.ndarray) -> np.ndarray:
        return self.oracles.validate(reports)  # type: ignore[attr-defined, no-any-return]

    def epsilon_central(self, n: int, delta: float) -> float:
        """Central epsilon of n clients. "sample": a client's one message hides among its level's n_j clients,
        taken at the delta/2 lower quantile of 1 + Bin(n - 1, 1/L) (the rest of delta for the shuffle bound);
        "all": n messages per level at eps/L, composed over the L levels."""
        alphas = [m.mixture_alpha for m in self.oracles.mechanisms]  # type: ignore[attr-defined]
        return central_epsilon_levels(self, alphas, n, delta)
