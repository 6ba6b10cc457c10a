"""Two of Beam's construction-time inspections, done once per object instead of dozens of times per run.

Why: a bounded run builds and translates its pipeline every time, and two of Beam's helpers redo the same
work on the same objects throughout (py-spy of the shuffle job, ``benchmarks/shuffle_ab.py``; ~0.15 s of CPU
per run, ~35% of a 1,000-set run's CPU and ~1.5 microseconds a set at 100,000):

- ``userstate.get_dofn_specs`` wraps every bound method of a DoFn (its own and the ~30 it inherits) and reads
  each one's signature, and Beam asks it of one instance up to seven times (building the ``ParDo``,
  translating it, then for the worker's copy in each bundle processor);
- ``PipelineOptions.view_as`` builds an argument parser and parses the flags again for every view, and the
  type checks of every applied transform ask for a ``TypeOptions`` view two or three times.

Both answers depend only on the object asked about: a DoFn's methods (their default arguments, or an
``_inspect_<method>`` hook), which it does not change once built; an options object's flags, fixed when it
is made, and its option values, which every view shares (one ``_all_options`` dict). So the first answer
for an object is kept, held beside a weak reference to it: a new DoFn (a worker's unpickled copy) or a new
options object is inspected afresh, and nothing is added to the objects themselves, so what Beam pickles
does not change. Errors are never kept (an invalid DoFn raises each time, as before); callers get fresh spec
sets; a view is kept only while it still shares its options' flags and values. The pipeline graph, its
coders and everything Beam decides from these answers are unchanged.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["memoize_beam_inspection"]

_lock = threading.Lock()
_installed: dict[str, Callable[..., Any]] = {}  # Beam's own functions, by name, once replaced


class _PerObject:
    """Values kept per live object (by identity, through a weak reference), under a sub-key."""

    def __init__(self) -> None:
        self._kept: dict[tuple[int, Hashable], tuple[weakref.ref, Any]] = {}

    def get(self, obj: Any, sub: Hashable = None) -> Any:
        entry = self._kept.get((id(obj), sub))
        return entry[1] if entry is not None and entry[0]() is obj else None

    def put(self, obj: Any, value: Any, sub: Hashable = None) -> None:
        key = (id(obj), sub)
        try:
            ref = weakref.ref(obj, lambda _: self._kept.pop(key, None))
        except TypeError:  # not weakly referable: asked again next time
            return
        self._kept[key] = (ref, value)


def memoize_beam_inspection() -> None:
    """Install both memos in this process (idempotent; see the module doc)."""
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.transforms import userstate

    with _lock:
        if _installed:
            return
        specs_of = getattr(userstate, "get_dofn_specs", None)
        view_of = getattr(PipelineOptions, "view_as", None)
        if specs_of is None or view_of is None:  # another Beam: a speed-up only, never a reason to fail a run
            import logging

            logging.getLogger(__name__).warning("this Beam has no userstate.get_dofn_specs or "
                                                "PipelineOptions.view_as: its inspections are not memoized")
            _installed["unavailable"] = memoize_beam_inspection  # warned once: later calls return at once
            return
        specs, views = _PerObject(), _PerObject()

        def get_dofn_specs(dofn: Any) -> Any:
            kept = specs.get(dofn)
            if kept is None:
                state, timers = specs_of(dofn)
                kept = (frozenset(state), frozenset(timers))
                specs.put(dofn, kept)
            return set(kept[0]), set(kept[1])  # fresh sets, as Beam's: a caller may change what it is given

        def view_as(self: Any, cls: type) -> Any:
            view = views.get(self, cls)
            if view is None or view._all_options is not self._all_options or view._flags is not self._flags:
                view = view_of(self, cls)
                views.put(self, view, cls)
            return view

        get_dofn_specs.__wrapped__ = specs_of  # type: ignore[attr-defined]
        view_as.__wrapped__ = view_of  # type: ignore[attr-defined]
        get_dofn_specs.__doc__, view_as.__doc__ = specs_of.__doc__, view_of.__doc__
        userstate.get_dofn_specs = get_dofn_specs
        PipelineOptions.view_as = view_as  # type: ignore[method-assign]
        _installed.update(get_dofn_specs=specs_of, view_as=view_of)
