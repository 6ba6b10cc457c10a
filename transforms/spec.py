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
from transforms.mechanisms.frequency.blanket import blanket_dummies_for
from transforms.mechanisms.registry import build_mechanism, mechanisms_for
from transforms.privacy.blanket import MAX_DUMMIES
from transforms.privacy.crowd_count import count_charges, design, neighbouring_notion, windows_per_year
from transforms.spec_tables import SpecError, _domain, _Reader

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
              "epsilon_year", "delta_year", "blanket_epsilon", "blanket_dummies"},
    "privacy": {"delta"},
    "clients": {"max_reports_per_window"},
}
DEFAULT_SPEC = Path(__file__).resolve().parents[1] / "examples" / "app_language.toml"


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
    # The shuffler's blanket (transforms.shuffler.blanket): m dummy reports per release so that a central epsilon
    # (replacement) of at most blanket_epsilon holds against ANY number of colluding enrolled devices. m is
    # computed when the spec is loaded (or given as blanket_dummies) and hashed, so shuffler and analyzer agree.
    blanket_epsilon: float | None = None
    blanket_dummies: int = 0

    @property
    def blanket(self) -> bool:
        """Whether the shuffler adds dummies (or the spec states a blanket target), so rows account for them."""
        return self.blanket_epsilon is not None or self.blanket_dummies > 0

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
_UNHASHED_DEFAULTS = {"membership": False, "epsilon_year": 1.0, "delta_year": 1e-6, "blanket_epsilon": None,
                      "blanket_dummies": 0}


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
        return _with_blanket(spec, "<override>")


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
        blanket_dummies=reader.get("crowd", "blanket_dummies", int, 0),
    )
    blanket_epsilon = reader.get("crowd", "blanket_epsilon", (int, float), None)
    if blanket_epsilon is not None:
        if "blanket_dummies" in reader.table("crowd"):
            reader.fail("crowd", "blanket_dummies", "and blanket_epsilon exclude each other (give one)")
        crowd = dataclasses.replace(crowd, blanket_epsilon=float(blanket_epsilon))
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
    return _with_blanket(spec, source)


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
        ("crowd", "blanket_epsilon", spec.crowd.blanket_epsilon,
         spec.crowd.blanket_epsilon is None or 0 < spec.crowd.blanket_epsilon <= 30, "must be in (0, 30]"),
        ("crowd", "blanket_dummies", spec.crowd.blanket_dummies, 0 <= spec.crowd.blanket_dummies <= MAX_DUMMIES,
         f"must be in [0, {MAX_DUMMIES}]"),
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


def _with_blanket(spec: AnalysisSpec, source: str) -> AnalysisSpec:
    """``spec`` with ``[crowd] blanket_dummies`` computed from ``blanket_epsilon`` (a one-line error if the
    mechanism has no accounted blanket; ``mechanisms.frequency.blanket.blanket_dummies_for`` says why)."""
    crowd = spec.crowd
    if not crowd.blanket:
        return spec
    key = "blanket_epsilon" if crowd.blanket_epsilon is not None else "blanket_dummies"
    try:
        m = blanket_dummies_for(spec.randomizer, crowd.blanket_epsilon, spec.delta, spec.max_reports_per_client,
                                crowd.blanket_dummies)
    except ValueError as err:
        raise SpecError(f"{source}: [crowd] {key}: {err}") from None
    return dataclasses.replace(spec, crowd=dataclasses.replace(crowd, blanket_dummies=m))
