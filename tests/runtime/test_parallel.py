"""The crypto thread pool: same results in the same order as a serial loop, whatever the thread count."""

from __future__ import annotations

import threading

import pytest

from transforms.runtime.parallel import MIN_CHUNK, map_ordered, thread_count


@pytest.mark.parametrize("threads", [0, 1, 2, 5])
@pytest.mark.parametrize("n", [0, 1, MIN_CHUNK * 2 - 1, MIN_CHUNK * 2, 1000])
def test_results_in_input_order(threads: int, n: int) -> None:
    items = list(range(n))
    assert map_ordered(lambda x: x * x, items, threads) == [x * x for x in items]


def test_large_inputs_use_several_threads() -> None:
    names: set[str] = set()
    barrier = threading.Barrier(2, timeout=10)  # passes only if two tasks run at the same time

    def work(x: int) -> int:
        names.add(threading.current_thread().name)
        if x % MIN_CHUNK == 0 and x < 2 * MIN_CHUNK:
            barrier.wait()
        return x

    assert map_ordered(work, list(range(4 * MIN_CHUNK)), 2) == list(range(4 * MIN_CHUNK))
    assert len(names) == 2 and all(n.startswith("esa-crypto") for n in names)


def test_thread_count() -> None:
    assert thread_count(3) == 3 and thread_count(0) >= 1
    with pytest.raises(ValueError, match=">= 0"):
        thread_count(-1)


def test_an_exception_is_a_bug_and_propagates() -> None:
    def boom(x: int) -> int:
        if x == 40:
            raise KeyError(x)
        return x

    with pytest.raises(KeyError):
        map_ordered(boom, list(range(100)), 2)
