"""Enrolment of devices: their public keys go into the shuffler's registry once.

In a deployment an enrolment service (the HTTP edge's ``POST /v1/enrol``, or ``python -m transforms.trust
enroll``) writes each device's Ed25519 public key to the compacted devices topic
(``transforms.trust.enrolment``); the shuffler reads it into its device store (``pipelines.registry``) and
accepts message sets signed by enrolled devices only. Simulations and demos derive their devices' keys from
``KEYS/encoder/fleet.key`` (``transforms.trust.devices.SimulatedFleet``) and enrol them here, like any other
device. ``enrol_simulated`` still writes the legacy ``KEYS/registry/devices.parquet`` (which the shuffler
imports once per version of the file) for the tests and tools that run without a broker.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from transforms.io.kafka.config import DEFAULT_CLIENT
from transforms.io.kafka.devices import produce_enrolments
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


def enrol_keys(bootstrap: str, topic: str, public_keys: Iterable[bytes], *,
               kafka_config: Mapping[str, Any] | None = None, client: str = DEFAULT_CLIENT) -> int:
    """Enrol raw Ed25519 public keys through the devices topic (created compacted if missing); every key is
    checked before any is written. Returns the records acknowledged by Kafka."""
    return produce_enrolments(bootstrap, topic, public_keys, producer_config=kafka_config, client=client)


def enrol_simulated_topic(keys_dir: Path, client_ids: Iterable[str], bootstrap: str, topic: str, *,
                          kafka_config: Mapping[str, Any] | None = None, client: str = DEFAULT_CLIENT) -> int:
    """``enrol_simulated`` through the devices topic: create missing keys, derive the simulated devices' keys
    and write their enrolments; returns the records acknowledged."""
    init_keys(Path(keys_dir))
    fleet = SimulatedFleet.from_keys_dir(Path(keys_dir))
    sent = enrol_keys(bootstrap, topic, (fleet.public_key(c) for c in client_ids), kafka_config=kafka_config,
                      client=client)
    LOG.info("%d simulated devices enrolled through %s", sent, topic)
    return sent
