"""``WindowEvent`` on disk: the ledger's JSON form (versioned, exact round trip) and the reader of the plain
"accounting" dict that ledgers stored before events (``from_account``: old ledgers load, and compose to the
same totals they did).
"""

from __future__ import annotations

from typing import Any

from .blanket_shuffle import BlanketDecomposition
from .events import EVENT_VERSION, NeighbouringRelation, WindowEvent

__all__ = ["EVENT_FORMAT", "from_account", "from_json", "to_json"]

EVENT_FORMAT = "esa-window-event"
_SCALARS = ("mechanism", "n_clients", "delta", "eps_local", "mixture_alpha", "channels", "reports_per_client",
            "own_accountant", "own_epsilon", "eps_central", "bound", "metric", "window_seconds", "count_sigma",
            "count_threshold", "count_charges")


def _blanket_json(dec: BlanketDecomposition) -> dict[str, Any]:
    return {"gamma": dec.gamma, "clone": dec.clone, "w1": dec.w1, "w2": dec.w2, "w0": dec.w0, "rule": dec.rule,
            "classes": [_blanket_json(c) for c in dec.classes]}


def _blanket(obj: dict[str, Any]) -> BlanketDecomposition:
    classes = tuple(_blanket(c) for c in obj.get("classes") or ())
    return BlanketDecomposition(obj["gamma"], obj["clone"], obj["w1"], obj["w2"], obj["w0"], obj.get("rule", ""),
                                classes)


def to_json(event: WindowEvent) -> dict[str, Any]:
    """The event as JSON-safe values (floats exact: JSON keeps every float's shortest repr)."""
    out: dict[str, Any] = {"format": EVENT_FORMAT, "version": event.version, "relation": event.relation.value}
    out.update({name: getattr(event, name) for name in _SCALARS})
    out["blanket"] = None if event.blanket is None else _blanket_json(event.blanket)
    out["legacy_count"] = None if event.legacy_count is None else list(event.legacy_count)
    return out


def from_json(obj: Any) -> WindowEvent:
    """``to_json``'s inverse; a clear ``ValueError`` on anything else (another format, another version)."""
    if not isinstance(obj, dict) or obj.get("format") != EVENT_FORMAT:
        raise ValueError(f"not a window event ({EVENT_FORMAT}): {str(obj)[:80]}")
    if obj.get("version") != EVENT_VERSION:
        raise ValueError(f"window event version {obj.get('version')!r}; this esa reads version {EVENT_VERSION}")
    unknown = set(obj) - {*_SCALARS, "format", "version", "relation", "blanket", "legacy_count"}
    if unknown:
        raise ValueError(f"window event with unknown fields {sorted(unknown)}")
    legacy = obj.get("legacy_count")
    return WindowEvent(relation=NeighbouringRelation(obj["relation"]),
                       blanket=None if obj.get("blanket") is None else _blanket(obj["blanket"]),
                       legacy_count=None if legacy is None else (float(legacy[0]), float(legacy[1])),
                       **{name: obj[name] for name in _SCALARS})


def from_account(account: dict[str, Any]) -> WindowEvent:
    """A ledger's "accounting" dict, as written before events, read as the event it described.

    Kept as it composed: an account marked ``own_accountant`` composes by its (eps_central, delta) (its
    shuffle parameters were not stored), any other by its pair; an account without ``count_charges`` (from
    before the yearly count design) keeps its per-window Laplace count as ``legacy_count``, charged only
    under a claim; without ``notion`` it is replacement, the only notion ledgers knew then."""
    own = bool(account.get("own_accountant"))
    n = int(account["n_clients"])
    eps_central = account.get("eps_central")
    crowd_eps = account.get("crowd_epsilon")
    blanket = account.get("blanket")
    return WindowEvent(
        mechanism=str(account.get("mechanism") or "unknown"),
        relation=NeighbouringRelation(account.get("notion") or NeighbouringRelation.REPLACEMENT.value),
        n_clients=n, delta=float(account["delta"]),
        eps_local=None if account.get("eps_local") is None else float(account["eps_local"]),
        mixture_alpha=None if own or account.get("mixture_alpha") is None else float(account["mixture_alpha"]),
        blanket=None if blanket is None else BlanketDecomposition(*blanket),
        channels=int(account.get("channels") or 1), own_accountant=own,
        own_epsilon=None if not own or eps_central is None or n < 2 else float(eps_central),
        eps_central=None if eps_central is None else float(eps_central), bound=account.get("eps_central_bound"),
        metric=account.get("metric"), window_seconds=account.get("window_seconds"),
        count_sigma=account.get("count_sigma"), count_threshold=account.get("count_threshold"),
        count_charges=int(account.get("count_charges") or 0) if "count_charges" in account else None,
        legacy_count=None if crowd_eps is None else (float(crowd_eps), float(account["crowd_delta"])),
    )
