"""Multi-message shuffle protocols of [MultiMsg] (docs/mathematics.md §7.1, §7.2): several anonymous messages
per client.

* :class:`MultiMessageHadamard` ([MultiMsg] §4.1, private coin): ``k_set + rho`` messages of tau Hadamard indices;
  error O(sqrt(k_set + rho)), decoding by GF(2) kernel enumeration (``multimessage_hadamard``);
* :class:`CountMinMultiRR` ([MultiMsg] §4.2, public coin): count-min sketch updates plus per-cell Bernoulli blanket
  messages; O(tau) query time, many more messages (``multimessage_countmin``).

Both follow the multi-message contract of ``base``: ``single_message = False``, ``channels = 1`` (all messages
of the protocol go to one shuffler), ``messages_per_channel`` = the most messages one client sends,
``encode_messages(values, rng) -> (reports, owner)`` (``encode_sets`` for set inputs, [MultiMsg] §5), accumulators
whose ``add(reports, clients)`` requires the number of clients, and ``epsilon_central(n, delta)`` /
``ledger(n)`` from the numeric accountants of ``transforms.privacy.multimessage`` (a client's message set
alone is not locally private: ``epsilon_local`` is inf).
"""

from __future__ import annotations

from transforms.mechanisms.multimessage.countmin import CountMinMultiRR, CountMinMultiRRAccumulator
from transforms.mechanisms.multimessage.hadamard import (
    MultiMessageHadamard,
    MultiMessageHadamardAccumulator,
    kernel_items,
)

__all__ = [
    "MULTI_MESSAGE_MECHANISMS",
    "CountMinMultiRR",
    "CountMinMultiRRAccumulator",
    "MultiMessageHadamard",
    "MultiMessageHadamardAccumulator",
    "kernel_items",
]

MULTI_MESSAGE_MECHANISMS: dict[str, type[MultiMessageHadamard] | type[CountMinMultiRR]] = {
    MultiMessageHadamard.name: MultiMessageHadamard,
    CountMinMultiRR.name: CountMinMultiRR,
}
