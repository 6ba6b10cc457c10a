"""Analysis specs: the TOML file that clients, shuffler and analyzer all read (docs/architecture.md).

A spec names one metric: its kind, its domain, the local randomizer and its budget, the window, the
crowd threshold of the shuffler and the central delta of the ledger. Its hash travels with every report
(``spec_id = name@hash``) so a report encoded under other parameters is dead-lettered instead of being
mixed into an estimate it does not belong to.

Loading validates every field and names the bad one (``SpecError``), because a typo in a privacy
parameter must stop the job, not silently fall back to a default.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from transforms.mechanisms.base import Mechanism, is_single_message
from transforms.mechanisms.registry import build_mechanism, mechanisms_for
from transforms.privacy.crowd_count import count_charges, design, neighbouring_notion, windows_per_year

KINDS = ("histogram", "kv_mean", "vector_mean", "range", "quantile", "heavy_hitters")
POSTPROCESS = ("none", "clip", "simplex")
MAX_CROWD_ID_LENGTH = 64
# Every table and key a spec may hold: anything else is a typo that must stop the job, not be ignored.
# ([mechanism] keys are checked against the chosen mechanism's own parameters in _check_mechanism.)
KNOWN_FIELDS: dict[str, set[str] | None] = {
    "analysis": {"name", "kind", "metric"},
    "domain": {"categories", "size", "grid", "keys", "s", "value_range", "dimension", "bits", "quantiles", "top"},
    "postprocess": {"method"},
    "mechanism": None,
    "window": {"size_seconds", "allowed_lateness_seconds"},
    "crowd": {"epsilon", "delta", "subkeys", "publish_deletions", "partition", "min_clients", "membership",
              "epsilon_year", "delta_year"},
    "privacy": {"delta"},
    "clients": {"max_reports_per_window"},
}
DEFAULT_SPEC = Path(__file__).resolve().parents[1] / "examples" / "app_language.toml"


class SpecError(ValueError):
    """An analysis spec that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class CrowdSpec:
    """Shuffler crowd threshold ([ESA] Algorithm 3): noisy count n + DLap(2/eps) - T, T = 2/eps ln(2/delta)."""

    epsilon: float = 1.0
    delta: float = 1e-6
    subkeys: int = 16  # a crowd is split over this many random sub-keys so no worker holds all of it
    # Publishing the deletion count next to n_reports reveals the exact crowd size the noise hides;
    # only for deployments where the analyst may know it (e.g. the shuffler's operator).
    publish_deletions: bool = False
    # Name of the public attribute (TelemetryEvent.crowd_id, e.g. a software version) whose values split
    # clients into crowds that are thresholded and analyzed separately ([ESA] §V); None: one crowd.
    partition: str | None = None
    # The smallest release: the shuffler withholds a crowd whose noisy target is below it, and the analyzer
    # refuses any release claiming fewer sets (a forged or truncated small crowd never gets estimates).
    min_clients: int = 10
    # A claim that whether a device reported in a window is private too (membership): the count is then
    # charged (one count per window; with a partition, two), as is any count under a partition.
    membership: bool = False
    # Where the count is charged it is a discrete Gaussian sized so a year of windows costs at most this
    # (transforms.privacy.crowd_count); epsilon/delta above then do not apply.
    epsilon_year: float = 1.0
    delta_year: float = 1e-6

    @property
    def charges(self) -> int:
        """Counts that change between neighbours per window (0: the count costs nothing)."""
        return count_charges(self.partition is not None, self.membership)

    @property
    def notion(self) -> str:
        """The neighbouring notion every published epsilon of this spec is stated in."""
        return neighbouring_notion(self.partition is not None, self.membership)

    def count_design(self, window_seconds: int) -> tuple[float, int] | None:
        """(sigma, T) of the charged count, sized for a year of ``window_seconds`` windows; None if free."""
        if not self.charges:
            return None
        return design(self.epsilon_year, self.delta_year, windows_per_year(window_seconds), self.charges)


# [crowd] fields added after specs were deployed: left out of the hash at their defaults, so every existing
# spec keeps its spec_id (devices in the field keep being accepted); any other value is hashed as usual.
_UNHASHED_DEFAULTS = {"membership": False, "epsilon_year": 1.0, "delta_year": 1e-6}


@dataclass(frozen=True)
class AnalysisSpec:
    """One metric with everything the three stages must agree on.

    ``categories`` names the estimated items: histogram categories, kv_mean keys, vector coordinates
    (``"0".."d-1"``); range, quantile and heavy-hitter analyses have none. ``domain_params`` holds the
    kind's other domain values (s, value_range, bits, quantiles, top, grid).
    """

    name: str
    metric: str
    categories: tuple[str, ...]
    mechanism: str
    epsilon: float
    mechanism_params: tuple[tuple[str, Any], ...] = ()
    window_seconds: int = 3600
    # Reports up to this late are dead-lettered as "late" (never released); later ones are dropped by Beam.
    allowed_lateness_seconds: int = 86400
    crowd: CrowdSpec = field(default_factory=CrowdSpec)
    delta: float = 1e-6
    max_reports_per_client: int = 1
    kind: str = "histogram"
    domain_params: tuple[tuple[str, Any], ...] = ()
    postprocess: str = "none"

    @property
    def d(self) -> int:
        return len(self.categories)

    @cached_property
    def domain(self) -> dict[str, Any]:
        """Domain values the mechanism is built from: d, the central delta and the kind's ``domain_params``."""
        return {"d": self.d, "delta": self.delta, **dict(self.domain_params)}

    @cached_property
    def spec_id(self) -> str:
        """``name@`` + 12 hex digits of the SHA-256 of the canonical JSON of every field."""
        fields = dataclasses.asdict(self)
        for key, default in _UNHASHED_DEFAULTS.items():  # added later: at their defaults, hashes stay as they were
            if fields["crowd"].get(key) == default:
                del fields["crowd"][key]
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return f"{self.name}@{hashlib.sha256(canonical.encode()).hexdigest()[:12]}"

    @cached_property
    def category_index(self) -> dict[str, int]:
        return {c: i for i, c in enumerate(self.categories)}

    @cached_property
    def randomizer(self) -> Mechanism:
        """The frozen mechanism object shared by encoder and analyzer."""
        return build_mechanism(self.mechanism, self.kind, self.domain, self.epsilon, dict(self.mechanism_params))

    def crowd_of(self, crowd_id: str | None) -> str | None:
        """The crowd a record belongs to: its crowd id if the spec partitions crowds, else None (one crowd).

        A crowd id the spec does not ask for is dropped rather than passed on: an attribute the spec does not
        name must not reach the shuffler's output. Encoder and shuffler both apply this one rule.
        """
        if self.crowd.partition is None:
            return None
        if not crowd_id:
            raise ValueError(f"no crowd_id: {self.name} splits crowds by {self.crowd.partition}")
        if len(crowd_id) > MAX_CROWD_ID_LENGTH:
            raise ValueError(f"crowd_id of {len(crowd_id)} characters (at most {MAX_CROWD_ID_LENGTH})")
        return crowd_id

    def with_mechanism(self, mechanism: str | None = None, epsilon: float | None = None) -> AnalysisSpec:
        """A copy with another randomizer or budget (a new spec_id); used by the demo's flags."""
        changes: dict[str, Any] = {}
        if mechanism is not None and mechanism != self.mechanism:
            changes.update(mechanism=mechanism, mechanism_params=())
        if epsilon is not None:
            changes["epsilon"] = float(epsilon)
        spec = dataclasses.replace(self, **changes)
        _check_numbers(spec, _Reader({}, "<override>"))
        _check_mechanism(spec, "<override>")
        return spec


class SpecSet(Mapping[str, "AnalysisSpec"]):
    """The specs a job serves, by ``spec_id``: what every stage looks a record's spec up in.

    Built once per stage; refuses two specs with one id (they would decode each other's reports).
    """

    def __init__(self, specs: Iterable[AnalysisSpec]):
        self._by_id: dict[str, AnalysisSpec] = {}
        for spec in specs:
            if spec.spec_id in self._by_id and self._by_id[spec.spec_id] is not spec:
                raise ValueError(f"two specs share the spec_id {spec.spec_id}")
            self._by_id[spec.spec_id] = spec

    def __getitem__(self, spec_id: str) -> AnalysisSpec:
        return self._by_id[spec_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)

    def __reduce__(self) -> tuple[Any, ...]:
        return SpecSet, (tuple(self._by_id.values()),)


def load_spec(path: str | Path) -> AnalysisSpec:
    """Read and validate a spec file; raises ``SpecError`` naming the file and the bad field."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError(f"{path}: no such spec file") from None
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"{path}: not valid TOML: {err}") from None
    return spec_from_dict(raw, source=str(path))


def spec_from_dict(raw: dict[str, Any], source: str = "<spec>") -> AnalysisSpec:
    """Validate a parsed TOML document (tables analysis, domain, mechanism, window, crowd, privacy)."""
    reader = _Reader(raw, source)
    _check_known_fields(raw, source)
    kind = reader.get("analysis", "kind", str, "histogram")
    if kind not in KINDS:
        reader.fail("analysis", "kind", f"must be one of {', '.join(KINDS)} (got {kind!r})")
    name = reader.get("analysis", "name", str)
    if not name or "@" in name:
        reader.fail("analysis", "name", "must be a non-empty string without '@'")
    categories, domain_params = _domain(reader, kind)
    postprocess = reader.get("postprocess", "method", str, "none")
    if postprocess not in POSTPROCESS:
        reader.fail("postprocess", "method", f"must be one of {', '.join(POSTPROCESS)} (got {postprocess!r})")
    partition = reader.get("crowd", "partition", str, None)
    if partition is not None and not partition:
        reader.fail("crowd", "partition", "must name the attribute that splits clients into crowds")
    mech_table = dict(reader.table("mechanism"))
    mechanism = reader.get("mechanism", "name", str)
    epsilon = reader.get("mechanism", "epsilon", (int, float))
    params = tuple(sorted((k, v) for k, v in mech_table.items() if k not in {"name", "epsilon"}))
    crowd = CrowdSpec(
        epsilon=reader.get("crowd", "epsilon", (int, float), CrowdSpec.epsilon),
        delta=reader.get("crowd", "delta", (int, float), CrowdSpec.delta),
        subkeys=reader.get("crowd", "subkeys", int, CrowdSpec.subkeys),
        publish_deletions=reader.get("crowd", "publish_deletions", bool, CrowdSpec.publish_deletions),
        min_clients=reader.get("crowd", "min_clients", int, CrowdSpec.min_clients),
        partition=partition,
        membership=reader.get("crowd", "membership", bool, CrowdSpec.membership),
        epsilon_year=float(reader.get("crowd", "epsilon_year", (int, float), CrowdSpec.epsilon_year)),
        delta_year=float(reader.get("crowd", "delta_year", (int, float), CrowdSpec.delta_year)),
    )
    spec = AnalysisSpec(
        name=name,
        kind=kind,
        metric=reader.get("analysis", "metric", str, name),
        categories=categories,
        mechanism=mechanism,
        epsilon=float(epsilon),
        mechanism_params=params,
        window_seconds=reader.get("window", "size_seconds", int, 3600),
        allowed_lateness_seconds=reader.get("window", "allowed_lateness_seconds", int, 86400),
        crowd=dataclasses.replace(crowd, epsilon=float(crowd.epsilon), delta=float(crowd.delta)),
        delta=float(reader.get("privacy", "delta", (int, float), 1e-6)),
        max_reports_per_client=reader.get("clients", "max_reports_per_window", int, 1),
        domain_params=domain_params,
        postprocess=postprocess,
    )
    _check_numbers(spec, reader)
    _check_mechanism(spec, source)
    return spec


def _check_known_fields(raw: dict[str, Any], source: str) -> None:
    for table, values in raw.items():
        if table not in KNOWN_FIELDS:
            raise SpecError(f"{source}: [{table}] is not a known table (known: {', '.join(KNOWN_FIELDS)})")
        allowed = KNOWN_FIELDS[table]
        if allowed is None or not isinstance(values, dict):
            continue
        for key in values:
            if key not in allowed:
                raise SpecError(f"{source}: [{table}] {key} is not a known field (known: {', '.join(sorted(allowed))})")


def _domain(reader: _Reader, kind: str) -> tuple[tuple[str, ...], tuple[tuple[str, Any], ...]]:
    """(item names, other domain values) of ``[domain]``, checked for the analysis kind."""
    domain = reader.table("domain")
    allowed = {"histogram": {"categories", "size", "grid"}, "kv_mean": {"keys", "s", "value_range"},
               "vector_mean": {"dimension", "value_range"}, "range": {"bits", "value_range"},
               "quantile": {"bits", "value_range", "quantiles"}, "heavy_hitters": {"bits", "top"}}[kind]
    for key in domain:
        if key not in allowed:
            reader.fail("domain", key, f"is not a field of a {kind} domain (fields: {', '.join(sorted(allowed))})")
    params: dict[str, Any] = {}
    if kind == "histogram":
        names = _categories(reader)
        grid = domain.get("grid")
        return names, ((("grid", (int(grid[0]), int(grid[1]))),) if grid else ())
    if kind == "kv_mean":
        keys = _names(reader, "keys")
        s = reader.get("domain", "s", int, 1)
        if not 1 <= s <= len(keys):
            reader.fail("domain", "s", f"must be in [1, number of keys = {len(keys)}] (got {s})")
        params = {"s": s, "value_range": _value_range(reader, (-1.0, 1.0))}
        return keys, tuple(params.items())
    if kind == "vector_mean":
        dim = reader.get("domain", "dimension", int)
        if dim < 1:
            reader.fail("domain", "dimension", f"must be >= 1 (got {dim})")
        return tuple(str(i) for i in range(dim)), (("value_range", _value_range(reader, (0.0, 1.0))),)
    bits = reader.get("domain", "bits", int)
    limit = 64 if kind == "heavy_hitters" else 24
    if not 1 <= bits <= limit:
        reader.fail("domain", "bits", f"must be in [1, {limit}] (got {bits})")
    params["bits"] = bits
    if kind in ("range", "quantile") and "value_range" in domain:
        params["value_range"] = _value_range(reader, None)
    if kind == "quantile":
        qs = reader.get("domain", "quantiles", list, [0.25, 0.5, 0.75])
        if not qs or not all(isinstance(q, int | float) and not isinstance(q, bool) and 0 < q < 1 for q in qs):
            reader.fail("domain", "quantiles", f"must list numbers in (0, 1) (got {qs!r})")
        params["quantiles"] = tuple(float(q) for q in qs)
    if kind == "heavy_hitters":
        top = reader.get("domain", "top", int, 10)
        if top < 1:
            reader.fail("domain", "top", f"must be >= 1 (got {top})")
        params["top"] = top
    return (), tuple(params.items())


def _names(reader: _Reader, key: str) -> tuple[str, ...]:
    names = reader.get("domain", key, list)
    if len(names) < 1 or not all(isinstance(c, str) and c for c in names):
        reader.fail("domain", key, "must list non-empty strings")
    if len(set(names)) != len(names):
        reader.fail("domain", key, "must not repeat a name")
    return tuple(names)


def _value_range(reader: _Reader, default: tuple[float, float] | None) -> tuple[float, float]:
    raw = reader.get("domain", "value_range", list, list(default) if default else reader._MISSING)
    ok = (len(raw) == 2 and all(isinstance(v, int | float) and not isinstance(v, bool) for v in raw)
          and all(math.isfinite(v) for v in raw) and raw[0] < raw[1])
    if not ok:
        reader.fail("domain", "value_range", f"must be [lo, hi] with finite lo < hi (got {raw!r})")
    return float(raw[0]), float(raw[1])


def _categories(reader: _Reader) -> tuple[str, ...]:
    domain = reader.table("domain")
    given = [k for k in ("categories", "size", "grid") if k in domain]
    if len(given) != 1:
        reader.fail("domain", "categories", "give exactly one of categories = [...], size = N or grid = [W, H]")
    if "grid" in domain:
        grid = reader.get("domain", "grid", list)
        if len(grid) != 2 or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 1 for g in grid):
            reader.fail("domain", "grid", f"must be [width, height] of positive integers (got {grid!r})")
        width, height = grid
        if width * height < 2:
            reader.fail("domain", "grid", "must have at least 2 cells")
        # row-major cells named "x,y": item index = y * width + x
        return tuple(f"{x},{y}" for y in range(height) for x in range(width))
    if "size" in domain:
        size = reader.get("domain", "size", int)
        if size < 2:
            reader.fail("domain", "size", f"must be >= 2 (got {size})")
        return tuple(str(i) for i in range(size))
    cats = reader.get("domain", "categories", list)
    if len(cats) < 2 or not all(isinstance(c, str) and c for c in cats):
        reader.fail("domain", "categories", "must list at least 2 non-empty strings")
    if len(set(cats)) != len(cats):
        reader.fail("domain", "categories", "must not repeat a category")
    return tuple(cats)


def _check_numbers(spec: AnalysisSpec, reader: _Reader) -> None:
    checks = [
        ("mechanism", "epsilon", spec.epsilon, 0 < spec.epsilon <= 30, "must be in (0, 30]"),
        ("window", "size_seconds", spec.window_seconds, spec.window_seconds >= 1, "must be >= 1"),
        ("window", "allowed_lateness_seconds", spec.allowed_lateness_seconds, spec.allowed_lateness_seconds >= 0,
         "must be >= 0"),
        ("crowd", "epsilon", spec.crowd.epsilon, 0 < spec.crowd.epsilon <= 30, "must be in (0, 30]"),
        ("crowd", "delta", spec.crowd.delta, 0 < spec.crowd.delta < 1, "must be in (0, 1)"),
        ("crowd", "epsilon_year", spec.crowd.epsilon_year, 0 < spec.crowd.epsilon_year <= 30, "must be in (0, 30]"),
        ("crowd", "delta_year", spec.crowd.delta_year, 0 < spec.crowd.delta_year < 1e-3, "must be in (0, 1e-3)"),
        ("crowd", "subkeys", spec.crowd.subkeys, 1 <= spec.crowd.subkeys <= 4096, "must be in [1, 4096]"),
        ("crowd", "min_clients", spec.crowd.min_clients, 1 <= spec.crowd.min_clients <= 10**9,
         "must be in [1, 1e9]"),
        ("privacy", "delta", spec.delta, 0 < spec.delta < 1, "must be in (0, 1)"),
        ("clients", "max_reports_per_window", spec.max_reports_per_client, spec.max_reports_per_client >= 1,
         "must be >= 1"),
    ]
    for table, key, value, ok, rule in checks:
        if not ok or (isinstance(value, float) and not math.isfinite(value)):
            reader.fail(table, key, f"{rule} (got {value!r})")


def _check_mechanism(spec: AnalysisSpec, source: str) -> None:
    if spec.mechanism not in mechanisms_for(spec.kind):
        raise SpecError(f"{source}: [mechanism] name must be one of {', '.join(mechanisms_for(spec.kind))} for a "
                        f"{spec.kind} analysis (got {spec.mechanism!r})")
    try:
        mechanism = spec.randomizer
    except (TypeError, ValueError) as err:  # the mechanism's own parameter checks, or an unknown parameter
        raise SpecError(f"{source}: [mechanism] {err}") from None
    if not is_single_message(mechanism) and spec.max_reports_per_client != 1:
        raise SpecError(f"{source}: [clients] max_reports_per_window must be 1 for {spec.mechanism}, whose clients "
                        f"send several messages per report (got {spec.max_reports_per_client})")


class _Reader:
    """Typed access to TOML tables with errors of the form 'file: [table] key ...'."""

    def __init__(self, raw: dict[str, Any], source: str):
        self.raw, self.source = raw, source

    def fail(self, table: str, key: str, message: str) -> None:
        raise SpecError(f"{self.source}: [{table}] {key} {message}")

    def table(self, name: str) -> dict[str, Any]:
        value = self.raw.get(name, {})
        if not isinstance(value, dict):
            raise SpecError(f"{self.source}: [{name}] must be a table")
        return value

    _MISSING = object()

    def get(self, table: str, key: str, kind: type | tuple[type, ...], default: Any = _MISSING) -> Any:
        values = self.table(table)
        if key not in values:
            if default is self._MISSING:
                self.fail(table, key, "is required")
            return default
        value = values[key]
        if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            self.fail(table, key, f"must be {names} (got {value!r})")
        return value
