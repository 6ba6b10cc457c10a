"""Analysis specs (transforms/spec.py): the example loads, spec_id is a stable hash, and every bad field is
refused with a SpecError naming the file, the table and the key (a typo in a privacy parameter must stop the
job, not fall back to a default)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from transforms.mechanisms.frequency.oracles import OLH
from transforms.spec import DEFAULT_SPEC, AnalysisSpec, SpecError, load_spec, spec_from_dict

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "app_language.toml"

GOOD = """\
[analysis]
name = "lang"
kind = "histogram"
metric = "ui_language"

[domain]
categories = ["en", "de", "fr", "ja"]

[mechanism]
name = "grr"
epsilon = 1.5

[window]
size_seconds = 600

[crowd]
epsilon = 0.5
delta = 1e-7
subkeys = 8

[privacy]
delta = 1e-8

[clients]
max_reports_per_window = 2
"""


def write(tmp_path: Path, text: str, name: str = "spec.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def replace_line(text: str, old: str, new: str) -> str:
    """``text`` with the one line ``old`` replaced by ``new`` (which may be several lines or empty)."""
    lines = text.splitlines()
    assert lines.count(old) == 1, old
    lines[lines.index(old)] = new
    return "\n".join(lines) + "\n"


def load_error(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message  # the file is named first
    return message


# --- the example and a complete spec ---------------------------------------------------------------------

def test_example_loads() -> None:
    spec = load_spec(EXAMPLE)
    assert EXAMPLE == DEFAULT_SPEC
    assert spec.name == "app_language" and spec.metric == "app_language" and spec.kind == "histogram"
    assert spec.d == 64 and len(set(spec.categories)) == 64
    assert spec.categories[:3] == ("en", "zh", "es") and spec.category_index["gl"] == 63
    assert spec.mechanism == "olh" and spec.epsilon == 2.0
    assert isinstance(spec.randomizer, OLH) and spec.randomizer.d == 64 and spec.randomizer.epsilon == 2.0
    assert spec.window_seconds == 3600
    assert (spec.crowd.epsilon, spec.crowd.delta, spec.crowd.subkeys) == (1.0, 1e-6, 16)
    assert spec.delta == 1e-6 and spec.max_reports_per_client == 1
    assert re.fullmatch(r"app_language@[0-9a-f]{12}", spec.spec_id)


def test_every_field_of_a_complete_spec_is_read(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, GOOD))
    assert spec.name == "lang" and spec.metric == "ui_language"
    assert spec.categories == ("en", "de", "fr", "ja")
    assert (spec.mechanism, spec.epsilon, spec.mechanism_params) == ("grr", 1.5, ())
    assert spec.window_seconds == 600
    assert (spec.crowd.epsilon, spec.crowd.delta, spec.crowd.subkeys) == (0.5, 1e-7, 8)
    assert spec.delta == 1e-8 and spec.max_reports_per_client == 2


def test_size_domain_and_defaults(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, '[analysis]\nname = "n"\n[domain]\nsize = 5\n'
                                     '[mechanism]\nname = "olh"\nepsilon = 1\ng = 3\nseed_family = 64\n'))
    assert spec.categories == ("0", "1", "2", "3", "4") and spec.metric == "n"
    assert spec.epsilon == 1.0 and isinstance(spec.epsilon, float)
    assert dict(spec.mechanism_params) == {"g": 3, "seed_family": 64}
    assert spec.randomizer.g == 3 and spec.randomizer.seed_family == 64
    assert spec.window_seconds == 3600 and spec.crowd.epsilon == 1.0 and spec.crowd.delta == 1e-6


# --- spec_id ---------------------------------------------------------------------------------------------

def test_spec_id_is_stable_across_loads(tmp_path: Path) -> None:
    first, second = load_spec(EXAMPLE), load_spec(EXAMPLE)
    assert first is not second and first.spec_id == second.spec_id
    copy = write(tmp_path, EXAMPLE.read_text(encoding="utf-8") + "\n# a comment changes nothing\n")
    assert load_spec(copy).spec_id == first.spec_id


def test_spec_id_ignores_int_versus_float_spelling(tmp_path: Path) -> None:
    a = load_spec(write(tmp_path, replace_line(GOOD, "epsilon = 1.5", "epsilon = 2"), "a.toml"))
    b = load_spec(write(tmp_path, replace_line(GOOD, "epsilon = 1.5", "epsilon = 2.0"), "b.toml"))
    assert a.spec_id == b.spec_id


def test_spec_id_changes_with_epsilon_and_mechanism() -> None:
    spec = load_spec(EXAMPLE)
    other_eps = spec.with_mechanism(epsilon=3.0)
    assert other_eps.epsilon == 3.0 and other_eps.randomizer.epsilon == 3.0
    assert other_eps.spec_id != spec.spec_id and other_eps.spec_id.startswith("app_language@")
    assert spec.with_mechanism(epsilon=2.0).spec_id == spec.spec_id  # same budget, same spec
    grr = spec.with_mechanism(mechanism="grr")
    assert grr.mechanism == "grr" and grr.spec_id not in {spec.spec_id, other_eps.spec_id}


@pytest.mark.parametrize(("old", "new"), [
    ('categories = ["en", "de", "fr", "ja"]', 'categories = ["en", "de", "ja", "fr"]'),
    ("size_seconds = 600", "size_seconds = 601"),
    ("delta = 1e-7", "delta = 2e-7"),
    ("subkeys = 8", "subkeys = 9"),
    ("subkeys = 8", "subkeys = 8\npublish_deletions = true"),
    ("delta = 1e-8", "delta = 1e-9"),
    ("max_reports_per_window = 2", "max_reports_per_window = 1"),
])
def test_spec_id_changes_with_every_shared_parameter(tmp_path: Path, old: str, new: str) -> None:
    base = load_spec(write(tmp_path, GOOD, "base.toml"))
    changed = load_spec(write(tmp_path, replace_line(GOOD, old, new), "changed.toml"))
    assert changed.spec_id != base.spec_id


# --- bad fields: SpecError naming the table and the key ----------------------------------------------------

BAD_FIELDS = [
    ("missing mechanism name", 'name = "grr"', "", "[mechanism] name", "required"),
    ("epsilon zero", "epsilon = 1.5", "epsilon = 0", "[mechanism] epsilon", "(0, 30]"),
    ("epsilon negative", "epsilon = 1.5", "epsilon = -1.0", "[mechanism] epsilon", "(0, 30]"),
    ("epsilon nan", "epsilon = 1.5", "epsilon = nan", "[mechanism] epsilon", "(0, 30]"),
    ("epsilon too large", "epsilon = 1.5", "epsilon = 31", "[mechanism] epsilon", "(0, 30]"),
    ("epsilon string", "epsilon = 1.5", 'epsilon = "two"', "[mechanism] epsilon", "'two'"),
    ("epsilon bool", "epsilon = 1.5", "epsilon = true", "[mechanism] epsilon", "True"),
    ("unknown mechanism", 'name = "grr"', 'name = "rappor9"', "[mechanism] name", "'rappor9'"),
    ("mechanism of another kind", 'name = "grr"', 'name = "collision"', "[mechanism] name", "'collision'"),
    ("unknown mechanism parameter", "epsilon = 1.5", "epsilon = 1.5\nbuckets = 4", "[mechanism] buckets",
     "not a parameter of grr"),
    ("olh parameter on grr", "epsilon = 1.5", "epsilon = 1.5\ng = 4", "[mechanism] g", "not a parameter of grr"),
    ("repeated category", 'categories = ["en", "de", "fr", "ja"]', 'categories = ["en", "de", "en"]',
     "[domain] categories", "repeat"),
    ("empty category", 'categories = ["en", "de", "fr", "ja"]', 'categories = ["en", ""]', "[domain] categories",
     "non-empty"),
    ("one category", 'categories = ["en", "de", "fr", "ja"]', 'categories = ["en"]', "[domain] categories",
     "at least 2"),
    ("categories and size", 'categories = ["en", "de", "fr", "ja"]', 'categories = ["en", "de"]\nsize = 2',
     "[domain] categories", "exactly one"),
    ("neither categories nor size", 'categories = ["en", "de", "fr", "ja"]', "", "[domain] categories",
     "exactly one"),
    ("size one", 'categories = ["en", "de", "fr", "ja"]', "size = 1", "[domain] size", ">= 2"),
    ("size float", 'categories = ["en", "de", "fr", "ja"]', "size = 8.0", "[domain] size", "int"),
    ("crowd delta one", "delta = 1e-7", "delta = 1.0", "[crowd] delta", "(0, 1)"),
    ("crowd delta above one", "delta = 1e-7", "delta = 2", "[crowd] delta", "(0, 1)"),
    ("crowd delta zero", "delta = 1e-7", "delta = 0.0", "[crowd] delta", "(0, 1)"),
    ("crowd epsilon zero", "epsilon = 0.5", "epsilon = 0.0", "[crowd] epsilon", "(0, 30]"),
    ("crowd subkeys zero", "subkeys = 8", "subkeys = 0", "[crowd] subkeys", "[1, 4096]"),
    ("publish_deletions not bool", "subkeys = 8", "subkeys = 8\npublish_deletions = 1", "[crowd] publish_deletions",
     "bool"),
    ("privacy delta one", "delta = 1e-8", "delta = 1", "[privacy] delta", "(0, 1)"),
    ("window zero", "size_seconds = 600", "size_seconds = 0", "[window] size_seconds", ">= 1"),
    ("window string", "size_seconds = 600", 'size_seconds = "1h"', "[window] size_seconds", "int"),
    ("quota zero", "max_reports_per_window = 2", "max_reports_per_window = 0", "[clients] max_reports_per_window",
     ">= 1"),
    ("unknown kind", 'kind = "histogram"', 'kind = "quantiles"', "[analysis] kind", "'quantiles'"),
    ("name with at", 'name = "lang"', 'name = "la@ng"', "[analysis] name", "'@'"),
    ("missing analysis name", 'name = "lang"', "", "[analysis] name", "required"),
]


@pytest.mark.parametrize(("case", "old", "new", "where", "why"), BAD_FIELDS, ids=[c[0] for c in BAD_FIELDS])
def test_bad_field_is_refused_naming_table_and_key(tmp_path: Path, case: str, old: str, new: str, where: str,
                                                    why: str) -> None:
    message = load_error(tmp_path, replace_line(GOOD, old, new))
    assert where in message, message
    assert why in message, message


def test_a_table_that_is_not_a_table(tmp_path: Path) -> None:
    without_crowd = GOOD.replace("[crowd]\nepsilon = 0.5\ndelta = 1e-7\nsubkeys = 8\n", "")
    assert "[crowd]" not in without_crowd
    assert "[crowd] must be a table" in load_error(tmp_path, "crowd = 3\n" + without_crowd)


@pytest.mark.parametrize(("table_line", "typo"), [
    ("[crowd]", "epsilom = 0.25"),        # a typo of the crowd budget would silently keep the default 1.0
    ("[privacy]", "detla = 1e-12"),       # ... of the ledger's central delta
    ("[window]", "size_second = 60"),     # ... of the window (a different crowd size)
    ("[clients]", "max_reports_per_windows = 5"),
    ("[analysis]", "metrc = \"other\""),
    ("[domain]", "categorys = [\"a\", \"b\"]"),
])
def test_an_unknown_key_is_refused_not_ignored(tmp_path: Path, table_line: str, typo: str) -> None:
    # spec.py promises "Loading validates every field and names the bad one ... because a typo in a privacy
    # parameter must stop the job, not silently fall back to a default". [mechanism] already refuses unknown
    # keys; the other tables must too.
    message = load_error(tmp_path, replace_line(GOOD, table_line, f"{table_line}\n{typo}"))
    assert f"{table_line} {typo.split(' ')[0]}" in message, message


def test_an_unknown_table_is_refused(tmp_path: Path) -> None:
    message = load_error(tmp_path, GOOD + "\n[crowds]\nepsilon = 0.1\n")
    assert "[crowds]" in message, message


def test_bad_toml_syntax(tmp_path: Path) -> None:
    message = load_error(tmp_path, GOOD.replace("epsilon = 1.5", "epsilon = = 1.5"))
    assert "not valid TOML" in message and "line 11" in message, message


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "spec.toml"
    with pytest.raises(SpecError, match=re.escape(f"{missing}: no such spec file")):
        load_spec(missing)


def test_spec_from_dict_names_its_source() -> None:
    with pytest.raises(SpecError, match=r"^inline: \[mechanism\] name is required"):
        spec_from_dict({"analysis": {"name": "x"}, "domain": {"size": 4}, "mechanism": {"epsilon": 1.0}},
                       source="inline")


# --- with_mechanism --------------------------------------------------------------------------------------

def test_with_mechanism_refuses_an_unknown_mechanism() -> None:
    with pytest.raises(SpecError, match=r"\[mechanism\] name must be one of .*'nope'"):
        load_spec(EXAMPLE).with_mechanism(mechanism="nope")


@pytest.mark.parametrize("epsilon", [0.0, -1.0, float("nan"), 31.0, 100.0])
def test_with_mechanism_applies_the_loader_epsilon_rule(epsilon: float) -> None:
    # A spec built by with_mechanism (the demo's --epsilon flag) must obey the same (0, 30] rule as a loaded
    # one: otherwise a spec exists that load_spec would refuse.
    with pytest.raises(SpecError, match=r"epsilon"):
        load_spec(EXAMPLE).with_mechanism(epsilon=epsilon)


def test_with_mechanism_keeps_the_original_unchanged() -> None:
    spec = load_spec(EXAMPLE)
    before = spec.spec_id
    changed = spec.with_mechanism(mechanism="oue", epsilon=1.0)
    assert isinstance(changed, AnalysisSpec) and changed.mechanism_params == ()
    assert spec.spec_id == before and spec.mechanism == "olh" and spec.epsilon == 2.0


def test_the_crowd_claim_fields_keep_old_spec_ids_at_their_defaults() -> None:
    """membership / epsilon_year / delta_year came later: at their defaults the hash is the one computed
    without them (devices already deployed keep their spec_id); any other value is a new spec."""
    import dataclasses
    import hashlib
    import json

    from transforms.spec import DEFAULT_SPEC, load_spec

    spec = load_spec(DEFAULT_SPEC)
    fields = dataclasses.asdict(spec)
    for key in ("membership", "epsilon_year", "delta_year", "blanket_epsilon", "blanket_dummies"):
        del fields["crowd"][key]
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    assert spec.spec_id == f"{spec.name}@{hashlib.sha256(canonical.encode()).hexdigest()[:12]}"
    for change in ({"membership": True}, {"epsilon_year": 2.0}, {"delta_year": 1e-7}):
        other = dataclasses.replace(spec, crowd=dataclasses.replace(spec.crowd, **change))
        assert other.spec_id != spec.spec_id, change
