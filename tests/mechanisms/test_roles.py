"""Every mechanism declares its optional roles on ``Randomizer`` instead of being probed for them.

The jobs read role names directly (``mechanism.accounts_central``, ``mechanism.input_range``...), so a
mechanism that overrides a role's method must also declare the flag that tells the jobs to use it: these
tests fail when a method is added without its declaration (or a flag without its method).
"""

from __future__ import annotations

import tomllib

import pytest

from pipelines.examples import example_names, example_path
from transforms.mechanisms.base import Randomizer
from transforms.mechanisms.registry import MECHANISMS
from transforms.spec import AnalysisSpec, load_spec, spec_from_dict

BASE = {"histogram": "app_language", "kv_mean": "feature_usage", "vector_mean": "sensor_vector",
        "range": "latency_range", "heavy_hitters": "url_heavy_hitters"}
EXTRA = {"mm_countmin": {"n_expected": 20000}, "mm_hadamard": {"n_expected": 20000}, "mm_range": {"n_expected": 2000},
         "vector_sum": {"n": 50000}}


def spec_of(name: str) -> AnalysisSpec:
    for example in example_names():
        raw = tomllib.loads(example_path(example).read_text(encoding="utf-8"))
        if raw["mechanism"]["name"] == name:
            return load_spec(example_path(example))
    raw = tomllib.loads(example_path(BASE[MECHANISMS[name].kinds[0]]).read_text(encoding="utf-8"))
    raw["mechanism"] = {"name": name, "epsilon": raw["mechanism"]["epsilon"], **EXTRA.get(name, {})}
    return spec_from_dict(raw)


def overrides(cls: type, method: str) -> bool:
    return getattr(cls, method) is not getattr(Randomizer, method)


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_every_registered_mechanism_is_a_randomizer(name: str) -> None:
    assert issubclass(MECHANISMS[name].load(), Randomizer)


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_overridden_methods_are_declared(name: str) -> None:
    cls = MECHANISMS[name].load()
    assert overrides(cls, "epsilon_central") == cls.accounts_central
    assert overrides(cls, "backstop_bits") == overrides(cls, "fragments_from_backstop")
    mechanism = spec_of(name).randomizer
    assert overrides(cls, "backstop_bits") == (mechanism.backstop_parameters is not None)
    assert overrides(cls, "central_guarantee") <= cls.calibrated_to_central


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_role_values_have_their_declared_types(name: str) -> None:
    mechanism = spec_of(name).randomizer
    assert isinstance(mechanism.single_message, bool)
    assert int(mechanism.channels) >= 1 and int(mechanism.messages_per_channel) >= 1
    assert mechanism.single_message or mechanism.expected_messages is None or mechanism.expected_messages > 0
    assert mechanism.epsilon_replacement is None or mechanism.epsilon_replacement > 0
    assert mechanism.input_range is None or len(mechanism.input_range) == 2
    if mechanism.epsilon_exposed(1) is not None:
        assert mechanism.fragments >= 1


def test_an_undeclared_own_accounting_is_caught() -> None:
    """A mechanism that adds ``epsilon_central`` but forgets the flag: the analyzer would silently use the
    generic bound, and the declaration test names it."""

    class Forgetful(MECHANISMS["grr"].load()):  # type: ignore[misc]
        def epsilon_central(self, n: int, delta: float) -> float:
            return 0.1

    assert overrides(Forgetful, "epsilon_central") != Forgetful.accounts_central


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_a_blanket_decomposition_is_declared_only_by_single_message_randomizers(name: str) -> None:
    # The per-mechanism shuffle bound (privacy.blanket_shuffle) accounts one report per client under the
    # replacement notion; a mechanism with its own accountant or several messages must not inherit one.
    from transforms.privacy.blanket_shuffle import BlanketDecomposition

    cls = MECHANISMS[name].load()
    declared = spec_of(name).randomizer.blanket_decomposition()
    assert declared is None or isinstance(declared, BlanketDecomposition)
    if overrides(cls, "blanket_decomposition"):
        assert cls.single_message and not cls.accounts_central and cls.epsilon_replacement is None
