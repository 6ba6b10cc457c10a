"""Opened payloads -> wire rows for a whole batch, the value domain checked once per batch, not per report.

Why: the analyzer opens a release batch of thousands of messages; each payload's structure (record type,
channel, field widths) is a few dictionary lookups, but the mechanism's ``validate`` on a one-row array costs
~14 microseconds of numpy overhead per report, more than the Avro decoding. Checked over the batch's stacked
rows it costs well under one. Every report still gets its own verdict: a row that fails is reported with its
reason, and the others are kept.

The payloads themselves are decoded per field over the whole batch (``transforms.wire.payload_codec``): it vouches
only for the plaintexts that are exactly the canonical encoding of their decoded row (every honest one);
anything else goes through ``decode_payload`` on its own and gets its verdict and reason.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from transforms.mechanisms.base import Mechanism, is_single_message
from transforms.wire.avro_payload import decode_payload
from transforms.wire.domain import domain_problems, invalid_mask, outside_reason
from transforms.wire.payload_codec import decode_canonical
from transforms.wire.rows import CHANNEL, PRESENCE, PayloadRow, array_to_rows, rows_to_array

__all__ = ["decode_payload_array", "decode_payloads", "domain_problems"]


def decode_payloads(mechanism: Mechanism, plaintexts: Sequence[bytes], channels: Sequence[int]
                    ) -> tuple[list[PayloadRow], list[int], list[tuple[int, str]]]:
    """Decode and check every opened payload of a batch: (usable rows, their indices, (index, reason) of the
    others), with the same verdicts as ``decode_payload`` on each."""
    array, kept, failures = decode_payload_array(mechanism, plaintexts, channels)
    return (array_to_rows(array) if len(array) else []), kept, failures  # (it cannot reshape an empty array)


def decode_payload_array(mechanism: Mechanism, plaintexts: Sequence[bytes], channels: Sequence[int]
                         ) -> tuple[np.ndarray, list[int], list[tuple[int, str]]]:
    """``decode_payloads`` with the usable rows as one wire array (``records.wire_dtype``), in index order."""
    fast_index, fast = decode_canonical(mechanism, plaintexts, channels)
    failures: list[tuple[int, str]] = []
    vouched = np.zeros(len(plaintexts), dtype=bool)
    try:
        vouched[fast_index] = True  # decoded: each is kept, or refused as outside the domain
        fast, fast_index = _dropoutside_reason(mechanism, fast, fast_index, failures)
    except (ValueError, OverflowError, TypeError):  # a value ``validate`` cannot take: the per-row check words it
        vouched[:] = False
        fast_index, fast = fast_index[:0], fast[:0]
    slow_rows: list[PayloadRow] = []
    slow_kept: list[int] = []
    for i in np.flatnonzero(~vouched).tolist():
        try:
            slow_rows.append(decode_payload(mechanism, plaintexts[i], channels[i], check_domain=False))
            slow_kept.append(i)
        except ValueError as err:
            failures.append((i, str(err)))
    problems = domain_problems(mechanism, slow_rows, [channels[i] for i in slow_kept])
    failures += [(slow_kept[j], p) for j, p in enumerate(problems) if p is not None]
    failures.sort()
    slow_index = [i for i, p in zip(slow_kept, problems, strict=True) if p is None]
    if not slow_index:
        return fast, fast_index.tolist(), failures
    slow = rows_to_array(mechanism, [r for r, p in zip(slow_rows, problems, strict=True) if p is None])
    index = np.concatenate([fast_index, np.array(slow_index, dtype=np.int64)])
    order = np.argsort(index, kind="stable")
    return np.concatenate([fast, slow])[order], index[order].tolist(), failures


def _dropoutside_reason(mechanism: Mechanism, rows: np.ndarray, index: np.ndarray, failures: list[tuple[int, str]]
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(rows, index) without the rows outside the output domain, whose (index, reason) join ``failures``."""
    check = np.flatnonzero(_needs_check(mechanism, rows))
    bad = check[invalid_mask(mechanism, rows[check])] if len(check) else check
    if not len(bad):
        return rows, index
    failures += [(int(index[j]), outside_reason(mechanism, row))
                 for j, row in zip(bad.tolist(), array_to_rows(rows[bad]), strict=True)]
    good = np.ones(len(rows), dtype=bool)
    good[bad] = False
    return rows[good], index[good]


def _needs_check(mechanism: Mechanism, rows: np.ndarray) -> np.ndarray:
    """Rows whose domain is checked: all but presence markers (their row is fixed, ``presence_row``)."""
    if is_single_message(mechanism) or CHANNEL not in (rows.dtype.names or ()):
        return np.ones(len(rows), dtype=bool)
    return np.asarray(rows[CHANNEL] != PRESENCE)
