"""Opened payloads -> wire rows for a whole batch, the value domain checked once per batch, not per report.

Why: the analyzer opens a release batch of thousands of messages; each payload's structure (record type,
channel, field widths) is a few dictionary lookups, but the mechanism's ``validate`` on a one-row array costs
~14 microseconds of numpy overhead per report, more than the Avro decoding. Checked over the batch's stacked
rows it costs well under one. Every report still gets its own verdict: a row that fails is reported with its
reason, and the others are kept.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from transforms.mechanisms.base import Mechanism, is_single_message
from transforms.records import CHANNEL, PRESENCE, PayloadRow, decode_payload, rows_to_array

__all__ = ["decode_payloads", "domain_problems"]


def _needs_domain_check(mechanism: Mechanism, channel: int, single: bool) -> bool:
    return single or channel != PRESENCE  # a presence marker's row is fixed (``presence_row``)


def _invalid(mechanism: Mechanism, rows: list[PayloadRow]) -> np.ndarray:
    """Boolean mask of the rows outside the mechanism's output domain; raises if the rows do not stack."""
    array = rows_to_array(mechanism, rows)
    names = mechanism.report_dtype.names
    view = array if CHANNEL in names or is_single_message(mechanism) else array[list(names)]
    return ~np.asarray(mechanism.validate(view), dtype=bool)


def domain_problems(mechanism: Mechanism, rows: Sequence[PayloadRow], channels: Sequence[int]) -> list[str | None]:
    """Per row: None if inside the mechanism's output domain, else why not. Rows must have passed the
    structural checks of ``payload_from_avro`` (``check_domain=False``)."""
    single = is_single_message(mechanism)
    problems: list[str | None] = [None] * len(rows)
    todo = [i for i, ch in enumerate(channels) if _needs_domain_check(mechanism, ch, single)]
    if not todo:
        return problems
    try:
        bad = _invalid(mechanism, [rows[i] for i in todo])
    except (ValueError, OverflowError, TypeError):
        bad = None  # one out-of-range value spoils the stack: find it row by row (only under attack)
    for j, i in enumerate(todo):
        if bad is None:
            try:
                row_bad = bool(_invalid(mechanism, [rows[i]])[0])
            except (ValueError, OverflowError, TypeError) as err:
                problems[i] = f"payload outside the output domain of {mechanism.name}: {err}"
                continue
        else:
            row_bad = bool(bad[j])
        if row_bad:
            problems[i] = f"payload {rows[i]} outside the output domain of {mechanism.name}(d={mechanism.d})"
    return problems


def decode_payloads(mechanism: Mechanism, plaintexts: Sequence[bytes], channels: Sequence[int]
                    ) -> tuple[list[PayloadRow], list[int], list[tuple[int, str]]]:
    """Decode and check every opened payload of a batch: (usable rows, their indices, (index, reason) of the
    others), with the same verdicts as ``decode_payload`` on each."""
    rows: list[PayloadRow] = []
    kept: list[int] = []
    failures: list[tuple[int, str]] = []
    for i, (data, channel) in enumerate(zip(plaintexts, channels, strict=True)):
        try:
            rows.append(decode_payload(mechanism, data, channel, check_domain=False))
            kept.append(i)
        except ValueError as err:
            failures.append((i, str(err)))
    problems = domain_problems(mechanism, rows, [channels[i] for i in kept])
    if any(p is not None for p in problems):
        failures += [(kept[j], p) for j, p in enumerate(problems) if p is not None]
        failures.sort()
        rows = [r for r, p in zip(rows, problems, strict=True) if p is None]
        kept = [i for i, p in zip(kept, problems, strict=True) if p is None]
    return rows, kept, failures
