"""Python's cyclic garbage collector tuned for workers that handle records a batch at a time.

Why: a job allocates a few container objects per record (tuples, dataclasses, dicts of a decoded datum) and
frees them with the batch. CPython runs a young collection every 700 net allocations, that is every few
records, and a full collection every hundred of those, and a full one walks every object alive, above all
the hundreds of thousands that importing Beam, NumPy, SciPy, fastavro and pyarrow created and that live as
long as the worker. ``tune_worker_gc`` moves those into the permanent generation (``gc.freeze``), where the
collector no longer walks them, and lets the young generation grow to ``YOUNG_THRESHOLD`` objects. Reference
cycles are still collected, only less often; reference counting, which frees almost everything here, is
untouched. Measured with ``benchmarks/pipeline.py`` (idle machine): the chain 4,038 -> 4,308 events/s at
n = 100,000 (medians of 3) and 4,857 -> 5,435 at 1,000,000, the encoder gaining most; peak RSS unchanged.

Before freezing, only the young and middle generations are collected: a full collection walks every object
alive, 0.1-0.25 s of CPU per job run (py-spy of the shuffle and analyze jobs' DoFn set-up, 2026-12-02), and
in a process that had imported the four jobs and built a pipeline it found 37 unreachable objects beyond
the 71 the middle collection found. Those few stay frozen for the process's life: once per process, bounded.

Called from the setup of the jobs' hot DoFns, so it holds in whichever process a runner runs them (the job's
own process on the local runner, SDK worker processes on Flink or Dataflow); ``--python_gc default`` keeps
the interpreter's settings.
"""

from __future__ import annotations

import gc
import logging
import os

__all__ = ["GC_MODES", "YOUNG_THRESHOLD", "tune_worker_gc"]

GC_MODES = ("tuned", "default")
YOUNG_THRESHOLD = 100_000  # objects allocated (net) between young collections; CPython's default is 700
_OLDER_THRESHOLDS = (50, 100)  # young collections per middle one, middle ones per full one (default 10, 10)

_LOG = logging.getLogger(__name__)
_tuned_in: int | None = None  # the pid that tuned its collector (a forked child must tune its own)


def tune_worker_gc(mode: str = "tuned") -> bool:
    """Tune this process's collector once (see the module doc); True if it is tuned now."""
    global _tuned_in
    if mode not in GC_MODES:
        raise ValueError(f"python_gc must be one of {', '.join(GC_MODES)}, got {mode!r}")
    if mode == "default":
        return False
    if _tuned_in != os.getpid():
        gc.collect(1)  # the young and middle generations' garbage is not frozen with the rest (see below)
        gc.freeze()
        gc.set_threshold(YOUNG_THRESHOLD, *_OLDER_THRESHOLDS)
        _tuned_in = os.getpid()
        if _LOG.isEnabledFor(logging.DEBUG):  # counting the frozen objects walks them all (~20 ms)
            _LOG.debug("garbage collector tuned: %d objects frozen, thresholds %s", gc.get_freeze_count(),
                       gc.get_threshold())
    return True
