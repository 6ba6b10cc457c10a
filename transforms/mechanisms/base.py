"""The one abstraction of esa-telemetry: a local randomizer with its analyzer (docs/architecture.md §2, §4).

Every mechanism is a frozen dataclass of its *public* parameters -- what clients, the shuffler and the
analyzer share -- and exposes the same small surface, so the Beam layer (encode, shuffle, analyze) is
written once:

* ``encode(values, rng)`` randomizes a whole batch of clients at once and returns a numpy structured
  array with ``report_dtype`` (one row per report);
* ``validate(reports)`` says which rows are in the mechanism's output domain (the shuffler dead-letters
  the others instead of letting a malformed report poison an estimate);
* ``new_accumulator()`` returns sufficient statistics as count arrays (memory O(state), never O(n));
* ``variance(counts, n)`` is the closed form of docs/mathematics.md, used for standard errors and tests;
* ``epsilon_local``, ``mixture_alpha`` (for the tight shuffle bound), ``message_bits``.

**Several messages per client** (attribute or report fragmenting, multi-message protocols, dyadic levels).
A mechanism whose client sends other than exactly one report sets ``single_message = False`` and provides
``encode_messages(values, rng) -> (reports, owner)``: one row per *message*, ``owner[i]`` the index of the
client (row of ``values``) that sent it, rows of one client consecutive; a client may send none. Then:

* ``channels`` (int, default 1): messages travel on channels ``0 .. channels-1`` (a channel is one
  shuffler instance, e.g. bit j of attribute fragmenting); the report dtype has an int64 ``channel``
  field, which the wire format carries as ``Report.channel`` rather than inside the payload;
* ``messages_per_channel`` (int, default 1): the most messages one client may send on one channel in one
  window (the shuffler dead-letters the excess as a flood);
* the analyzer cannot count clients from messages, so accumulators take ``add(reports, clients)``: the
  number of clients whose messages ``reports`` are (the shuffler releases or deletes a client's whole
  message set, and publishes how many clients it released). Single-message accumulators ignore it.

**Payloads.** ``payload_kind`` names the Avro payload record (``schemas/Report.avsc``) whose fields are
the report dtype's fields (minus ``channel``): scalar ints -> ``long``, scalar floats -> ``double``,
fixed-shape ``uint8`` sub-arrays -> ``bytes`` (packed bits; the record's ``length`` field, if any, must
equal the mechanism's ``bit_length`` or else ``d``), fixed-shape int/float sub-arrays -> ``array``.
Known kinds: ``category``, ``bits``, ``hashed``, ``mark`` (no fields: the channel is the message),
``sketch`` (row + bits), ``key_value`` (key + value), ``coordinates`` (indices + values),
``vector`` (values), ``integers`` (values).

This module, like all of ``transforms.mechanisms``, imports neither Beam, Kafka nor Avro: it is the
library a device could run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Randomness(Protocol):
    """The randomness a mechanism may draw; numpy's ``Generator`` satisfies it.

    Row ``i`` of every draw of shape ``(n, ...)`` belongs to client ``i``. Keyed per-element sources
    (``transforms.mechanisms.randomness.KeyedRandom``) rely on this to make a retried Beam bundle
    reproduce exactly the same reports whatever the batch boundaries are.
    """

    def random(self, size: int | tuple[int, ...]) -> np.ndarray:
        """Uniform float64 in [0, 1) of the given shape."""
        ...

    def integers(self, low: int | np.ndarray, high: int | np.ndarray, size: int | tuple[int, ...]) -> np.ndarray:
        """Uniform int64 in [low, high) (``high`` may be an array broadcast against ``size``)."""
        ...


@dataclass(frozen=True)
class FrequencyEstimate:
    """Histogram estimate of one window/crowd: per-item frequency with its closed-form standard error.

    ``frequency`` and ``stderr`` are fractions of the ``n`` reports analyzed; ``count`` is the unbiased
    count estimate (``frequency * n``) that the estimators produce first.
    """

    count: np.ndarray
    frequency: np.ndarray
    stderr: np.ndarray
    n: int
    extras: dict[str, Any] = field(default_factory=dict)


class Accumulator(Protocol):
    """Sufficient statistics of a batch of reports: count arrays, mergeable in any order."""

    n: int  # reports (single-message) or clients (several messages per client) folded in so far

    def add(self, reports: np.ndarray, clients: int | None = None) -> None:
        """Fold a structured array of (already validated) reports of ``clients`` clients into the counts."""
        ...

    def merge(self, other: Accumulator) -> None:
        """Add another accumulator of the same mechanism into this one (in place)."""
        ...

    def estimate(self) -> FrequencyEstimate:
        """Decode the counts into unbiased estimates with standard errors."""
        ...


class Mechanism(Protocol):
    """What the Beam layer needs of a frequency-oracle mechanism."""

    name: ClassVar[str]
    payload_kind: ClassVar[str]  # which Report payload record carries it: "category", "bits" or "hashed"
    d: int
    epsilon: float

    @property
    def report_dtype(self) -> np.dtype: ...

    @property
    def epsilon_local(self) -> float: ...

    @property
    def mixture_alpha(self) -> float: ...

    @property
    def message_bits(self) -> int: ...

    def encode(self, values: np.ndarray, rng: Randomness) -> np.ndarray: ...

    def validate(self, reports: np.ndarray) -> np.ndarray: ...

    def new_accumulator(self) -> Accumulator: ...

    def variance(self, counts: np.ndarray, n: int) -> np.ndarray: ...

    def parameters(self) -> dict[str, Any]: ...


class Randomizer:
    """Base of every mechanism: the optional roles a mechanism may take, declared here with their defaults.

    A mechanism overrides what it has (a class attribute, a dataclass field, a property or a method of the
    same name); code that uses a mechanism reads these names directly instead of probing for them, so the
    contract is this class, and a misspelt override is caught by a test rather than silently ignored.
    Plain class attributes (never properties) keep a frozen dataclass free to declare the same name as a field.
    """

    # --- how a client's messages travel (see the module doc) ---
    single_message: ClassVar[bool] = True
    channels: int = 1
    messages_per_channel: int = 1
    bit_length: int | None = None  # packed-bits payloads: the bit count of ``length`` (None: ``d``)
    expected_messages: float | None = None  # mean messages per client, where it is not exactly one
    fragments: int = 1  # report fragmenting: how many fragments a client's report is cut into

    # --- what the client's value goes through before it is randomized ---
    input_range: tuple[float, float] | None = None  # the value range the randomizer expects (vectors)
    clip: float | bool | None = None  # how out-of-range values are clipped (None: refused)
    prefix_lengths: tuple[int, ...] | None = None  # tree mechanisms: the prefix length of each level
    max_keys: int | None = None  # key-value mechanisms: most keys one event may hold

    # --- privacy facts beyond ``epsilon_local`` and ``mixture_alpha`` ---
    accounts_central: ClassVar[bool] = False  # True: ``epsilon_central`` is the mechanism's own accounting
    epsilon_replacement: float | None = None  # local epsilon under replacement where ``epsilon_local`` is removal
    backstop_parameters: dict[str, Any] | None = None  # a permanent (memoized) randomization's parameters
    n_expected: int | None = None  # shuffle-only protocols: the crowd size their noise is calibrated for
    calibrated_to_central: ClassVar[bool] = False  # True: ``epsilon`` is a central target the noise is sized to

    def blanket_decomposition(self) -> Any:
        """The privacy-blanket decomposition of the randomizer for the per-mechanism shuffle bound
        (``transforms.privacy.blanket_shuffle.BlanketDecomposition``: blanket weight gamma <= sum_y min_x P(y|x),
        the blanket draws' clone probability and the victim's weights), or None: only the generic clone pair
        applies. tests/privacy/test_blanket_shuffle.py checks every declaration against the exact output
        table by linear programming, so a declared gamma above the true common mass fails."""
        return None

    def epsilon_central(self, n: int, delta: float) -> float:
        """The mechanism's own central epsilon for n clients (only where ``accounts_central``)."""
        raise NotImplementedError(f"{type(self).__name__} has no own central accounting: use the shuffle bound")

    def epsilon_central_removal(self, n: int, delta: float) -> float | None:
        """Central epsilon under removal neighbours, where it differs from the replacement one (else None)."""
        return None

    def epsilon_exposed(self, t: int) -> float | None:
        """Local epsilon when t of a client's report fragments are exposed (None: the mechanism does not fragment)."""
        return None

    def ledger(self, n: int) -> dict[str, Any] | None:
        """A multi-message protocol's ledger details for n clients (None: nothing beyond the row's columns)."""
        return None

    def central_guarantee(self) -> tuple[float, float] | None:
        """(epsilon, delta) the mechanism guarantees by its own calibration, if it has one (None: it has not)."""
        return None

    def backstop_bits(self, values: np.ndarray, rng: Randomness) -> np.ndarray:
        """The permanent randomization of a memoizing mechanism (only where ``backstop_parameters`` is set)."""
        raise NotImplementedError(f"{type(self).__name__} has no permanent randomization")

    def fragments_from_backstop(self, backstop: np.ndarray, rng: Randomness) -> tuple[np.ndarray, np.ndarray]:
        """Fresh reports from a stored backstop (only where ``backstop_parameters`` is set)."""
        raise NotImplementedError(f"{type(self).__name__} has no permanent randomization")


def check_epsilon(epsilon: float) -> None:
    """Refuse a local budget that is not a finite positive number (clear error at construction)."""
    if not np.isfinite(epsilon) or epsilon <= 0:
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")


def check_domain(d: int) -> None:
    """Refuse a domain that no randomizer can hide a value in."""
    if int(d) != d or d < 2:
        raise ValueError(f"domain size d must be an integer >= 2, got {d!r}")


def check_values(values: np.ndarray, d: int) -> np.ndarray:
    """Return ``values`` as int64 after checking they lie in [0, d) -- a client never encodes garbage."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"values must be a 1-D batch, got shape {arr.shape}")
    if arr.size and (not np.issubdtype(arr.dtype, np.integer)):
        raise TypeError(f"values must be integer category indices, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and (arr.min() < 0 or arr.max() >= d):
        bad = arr[(arr < 0) | (arr >= d)][0]
        raise ValueError(f"value {bad} outside the domain [0, {d})")
    return arr


def replacement_local_epsilon(mechanism: Randomizer) -> float:
    """Local epsilon under replacement neighbours: ``epsilon_replacement`` where the mechanism declares a
    removal budget as ``epsilon_local`` ([ESA]'s unary encodings), else ``epsilon_local``."""
    declared = mechanism.epsilon_replacement
    return float(declared if declared is not None else mechanism.epsilon_local)


def is_single_message(mechanism: Randomizer) -> bool:
    """True if every client sends exactly one report (the default)."""
    return bool(mechanism.single_message)


def channel_count(mechanism: Randomizer) -> int:
    """Number of channels the mechanism's messages travel on (1 unless it fragments)."""
    return int(mechanism.channels)


def messages_per_channel(mechanism: Randomizer) -> int:
    """Most messages one client sends on one channel in one window (the shuffler's flood quota)."""
    return int(mechanism.messages_per_channel)


def encode_messages(mechanism: Any, values: Any, rng: Randomness) -> tuple[np.ndarray, np.ndarray]:
    """``(reports, owner)`` of a batch of clients, for single- and multi-message mechanisms alike."""
    if is_single_message(mechanism):
        reports = mechanism.encode(values, rng)
        return reports, np.arange(len(reports), dtype=np.int64)
    reports, owner = mechanism.encode_messages(values, rng)
    return reports, np.asarray(owner, dtype=np.int64)


@dataclass(frozen=True)
class KeyValueEstimate:
    """Key-value / sparse-vector estimate (docs/mathematics.md §3): per item ``2j + (b = +1)`` and per key.

    ``frequency`` [2d] = f(j_-), f(j_+) interleaved; ``mean`` [d] = f(j_+) - f(j_-); ``nonmissing`` [d] =
    f(j_+) + f(j_-); ``conditional_mean`` [d] = mean / nonmissing (NaN where undefined). All are fractions of the
    ``n`` clients, each with a standard error; ``counts`` is the accumulator's raw count array.
    """

    frequency: np.ndarray
    frequency_stderr: np.ndarray
    mean: np.ndarray
    mean_stderr: np.ndarray
    nonmissing: np.ndarray
    nonmissing_stderr: np.ndarray
    conditional_mean: np.ndarray
    conditional_mean_stderr: np.ndarray
    n: int
    counts: np.ndarray
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def stderr(self) -> np.ndarray:
        """Standard error of ``frequency`` (the field name a histogram consumer expects)."""
        return self.frequency_stderr


@dataclass(frozen=True)
class VectorEstimate:
    """Mean of real vectors (docs/mathematics.md §4): per-coordinate ``mean`` [d] with its ``stderr`` over the ``n``
    clients analyzed; ``extras`` carries mechanism-specific arrays (sums, per-coordinate report counts, ...)."""

    mean: np.ndarray
    stderr: np.ndarray
    n: int
    extras: dict[str, Any] = field(default_factory=dict)
