"""Analyzer state of the channel-message ("mark") mechanisms of ``unary``: one count per channel plus the number
of clients, which the shuffler publishes (set bits alone cannot tell how many clients sent nothing)."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from transforms.mechanisms.base import FrequencyEstimate, Randomizer, Randomness
from transforms.mechanisms.frequency.counting import CountAccumulator, empty_mask_if_malformed, refuse_invalid

__all__ = ["CHANNEL_DTYPE", "ChannelMessages", "MessageCountAccumulator", "channel_messages", "validate_channels"]

CHANNEL_DTYPE = np.dtype([("channel", "<i8")])  # payload kind "mark": the channel is the whole message


class _ChannelMechanism(Protocol):
    name: str
    channels: int

    def validate(self, reports: np.ndarray) -> np.ndarray: ...

    def decode(self, counts: np.ndarray, n: int) -> np.ndarray: ...

    def variance(self, counts: np.ndarray, n: int) -> np.ndarray: ...


def validate_channels(reports: np.ndarray, channels: int) -> np.ndarray:
    """Rows that are well-formed channel messages with a channel in [0, channels)."""
    bad = empty_mask_if_malformed(reports, CHANNEL_DTYPE)
    if bad is not None:
        return bad
    channel = reports["channel"]
    return (channel >= 0) & (channel < channels)


def channel_messages(channel: np.ndarray, owner: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(reports, owner) of the contract's ``encode_messages`` from channel ids and owning client rows."""
    reports = np.empty(channel.size, dtype=CHANNEL_DTYPE)
    reports["channel"] = channel
    return reports, owner.astype(np.int64, copy=False)


class MessageCountAccumulator(CountAccumulator):
    """Per-channel message counts (``channels`` int64) and the number of clients ``n`` (from the shuffler).

    Merge by addition. ``add`` needs ``clients``: the analyzer cannot count clients from set bits (a client may
    send nothing). Consistency (no channel holds more messages than clients) is checked at ``estimate`` so
    that messages and client counts may arrive in separate ``add`` calls.
    """

    def __init__(self, mechanism: _ChannelMechanism) -> None:
        super().__init__(mechanism, (mechanism.channels,))  # type: ignore[arg-type]

    def add(self, reports: np.ndarray, clients: int | None = None) -> None:
        """Fold the messages of ``clients`` clients (validated: invalid ones are refused, not miscounted)."""
        if clients is None:
            raise ValueError(
                f"{self.mechanism.name} accumulators need clients=<number of clients whose messages these are> "
                "(published by the shuffler): set bits alone cannot tell how many clients sent nothing"
            )
        if isinstance(clients, bool) or int(clients) != clients or clients < 0:
            raise ValueError(f"clients must be an integer >= 0, got {clients!r}")
        arr = np.asarray(reports)
        if arr.size:
            m = self.mechanism
            refuse_invalid(m.validate(arr), f"messages are outside the {m.name} channels [0, {m.channels})")
            self.counts += np.bincount(arr["channel"], minlength=self.mechanism.channels)
        self.n += int(clients)

    def estimate(self) -> FrequencyEstimate:
        """Unbiased counts and frequencies with closed-form standard errors (fractions of the n clients)."""
        if self.n == 0:
            raise ValueError("no clients")
        if self.counts.max(initial=0) > self.n:
            channel = int(np.argmax(self.counts))
            raise ValueError(
                f"channel {channel} holds {int(self.counts[channel])} messages from {self.n} clients; a client "
                "sends at most one message per channel (wrong clients count?)"
            )
        count = self.mechanism.decode(self.counts, self.n)
        stderr = np.sqrt(self.mechanism.variance(count, self.n)) / self.n
        return FrequencyEstimate(count=count, frequency=count / self.n, stderr=stderr, n=self.n)


class ChannelMessages(Randomizer):
    """Mixin of the "mark" mechanisms (a message is a channel id; ``channels``, ``encode_messages`` come from the
    mechanism): the contract's ``encode``, ``validate`` and ``new_accumulator``."""

    def encode(self, values: np.ndarray, rng: Randomness) -> np.ndarray:
        """The messages of ``encode_messages`` without their owners."""
        return self.encode_messages(values, rng)[0]  # type: ignore[attr-defined, no-any-return]

    def validate(self, reports: np.ndarray) -> np.ndarray:
        return validate_channels(reports, self.channels)  # type: ignore[attr-defined]

    def new_accumulator(self) -> MessageCountAccumulator:
        return MessageCountAccumulator(self)  # type: ignore[arg-type]
