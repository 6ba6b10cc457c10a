"""How a bounded read cuts what it polled into Beam elements: bounded in records and in bytes, order kept."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from transforms.io.kafka.bounded import KafkaRecord, element_batches


def records(sizes: list[int]) -> list[KafkaRecord]:
    return [KafkaRecord("t", 0, i, 0, None, None if n < 0 else b"x" * n) for i, n in enumerate(sizes)]


@given(st.lists(st.integers(-1, 300), max_size=60), st.integers(1, 7), st.integers(1, 900))
def test_slices_cover_everything_in_order_within_both_bounds(sizes: list[int], max_records: int,
                                                             max_bytes: int) -> None:
    recs = records(sizes)
    slices = list(element_batches(recs, max_records, max_bytes))
    assert [r for s in slices for r in s] == recs and all(slices)
    for s in slices:
        total = sum(len(r.value or b"") for r in s)
        assert len(s) <= max_records and (total <= max_bytes or len(s) == 1)


def test_large_release_batches_are_spread_over_elements() -> None:
    big = records([512 * 1024] * 40)  # 40 release batches of 512 KiB
    assert [len(s) for s in element_batches(big)] == [16, 16, 8]  # 8 MiB per element
    assert [len(s) for s in element_batches(records([10] * 4500))] == [2000, 2000, 500]
