"""Enrolment of simulated devices: their public keys go into the shuffler's registry once.

In a deployment an enrolment service (attesting real devices) adds each device's Ed25519 public key to
the registry in ``KEYS/registry/devices.parquet``; the shuffler then accepts message sets signed by
enrolled devices only. Simulations and demos derive their devices' keys from ``KEYS/encoder/fleet.key``
(``transforms.trust.devices.SimulatedFleet``) and enrol them here, like any other device.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from transforms.trust.devices import DeviceRegistry, SimulatedFleet
from transforms.trust.keys import init_keys
from transforms.trust.layout import KeysDir

LOG = logging.getLogger(__name__)


def registry_path(keys_dir: Path) -> Path:
    return KeysDir(Path(keys_dir)).device_registry


def enrol_simulated(keys_dir: Path, client_ids: Iterable[str]) -> int:
    """Create missing keys, derive the simulated devices' keys and enrol them; returns the registry size."""
    init_keys(Path(keys_dir))
    path = registry_path(keys_dir)
    registry = DeviceRegistry.load(path)
    SimulatedFleet.from_keys_dir(Path(keys_dir)).enroll(registry, client_ids)
    registry.save(path)
    LOG.info("%d devices enrolled in %s", len(registry), path)
    return len(registry)
