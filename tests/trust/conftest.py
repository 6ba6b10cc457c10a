"""Fixture of the trust tests: a fresh keys directory and an enrolled simulated fleet (see trust_helpers)."""

from __future__ import annotations

from pathlib import Path

import pytest
from trust_helpers import Trust, make_trust


@pytest.fixture
def trust(tmp_path: Path) -> Trust:
    return make_trust(tmp_path / "keys")
