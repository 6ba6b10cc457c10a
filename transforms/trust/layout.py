"""The keys directory's layout, named once: which domain's keys live where.

Each trust domain reads only its own sub-directory (plus ``public/``), so the layout is also the map of who
may hold what: ``analyzer/`` only on the analyzer's machines, ``shuffler/`` and ``registry/`` only on the
shuffler's, ``encoder/`` only on an edge encoder's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class KeysDir:
    """Paths inside one keys directory (nothing is created or read here)."""

    root: Path

    @property
    def public(self) -> Path:
        """Public keys every domain may read (analyzer sealing keys, shuffler verification keys)."""
        return Path(self.root) / "public"

    @property
    def analyzer(self) -> Path:
        return Path(self.root) / "analyzer"

    @property
    def shuffler(self) -> Path:
        return Path(self.root) / "shuffler"

    @property
    def encoder(self) -> Path:
        return Path(self.root) / "encoder"

    @property
    def device_registry(self) -> Path:
        """The enrolled devices' public keys, which the shuffler verifies message sets against."""
        return Path(self.root) / "registry" / "devices.parquet"

    @property
    def shuffler_prf_key(self) -> Path:
        return self.shuffler / "prf.key"

    @property
    def encoder_prf_key(self) -> Path:
        return self.encoder / "prf.key"

    @property
    def fleet_key(self) -> Path:
        """The simulated fleet's seed (demos and tests only)."""
        return self.encoder / "fleet.key"
