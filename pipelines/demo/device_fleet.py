"""Simulated devices that encode themselves with the device client library (``esa simulate --devices``).

Each simulated device is a ``transforms.device.Client`` with its own state directory (key, budget,
memoized randomization) and its signing key from the simulation's fleet secret (so it is enrolled like the
edge encoder's devices). Its signed message sets go straight to the reports topic: this is the path a
real device takes, and what the shuffler's ingestion is built for. Devices over their budget do not
report, and say why (counted here).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pipelines.demo.population import Population, avro_value
from transforms.device import Budget, BudgetExceeded, Client
from transforms.mechanisms.randomness import seeded_stream
from transforms.spec import AnalysisSpec
from transforms.trust.devices import SimulatedFleet
from transforms.trust.keys import load_analyzer_public, load_shuffler_sealing_public

LOG = logging.getLogger(__name__)


@dataclass
class FleetOutcome:
    """What the simulated devices did: reports sent, reports their budget refused (with one reason)."""
    sent: int = 0
    refused: int = 0
    reasons: list[str] = field(default_factory=list)


def device_messages(spec: AnalysisSpec, population: Population, device_root: Path, keys_dir: Path, *,
                    budget_epsilon: float | None = None, seed: int | None = None,
                    outcome: FleetOutcome | None = None) -> Iterator[tuple[bytes, bytes]]:
    """(device id, signed MessageSet) per event of the population, encoded on each simulated device."""
    fleet = SimulatedFleet.from_keys_dir(Path(keys_dir))
    key_id, analyzer = load_analyzer_public(Path(keys_dir))
    shuffler_id, shuffler = load_shuffler_sealing_public(Path(keys_dir))
    budget = Budget(budget_epsilon) if budget_epsilon else None
    outcome = outcome if outcome is not None else FleetOutcome()
    crowds = population.crowd_ids if population.crowd_ids is not None else [None] * len(population)
    for i, (cid, value, t, crowd) in enumerate(zip(population.client_ids, population.values,
                                                   population.event_times_ms, crowds, strict=True)):
        rng = seeded_stream(seed, "demo-device", i) if seed is not None else None
        client = Client(spec, Path(device_root) / cid, analyzer_public_key=analyzer, analyzer_key_id=key_id,
                        shuffler_public_key=shuffler, shuffler_key_id=shuffler_id,
                        budget=budget, signing_key=fleet.signing_key(cid), rng=rng)
        try:
            data = client.encode(avro_value(spec, value), event_time_ms=int(t), crowd_id=crowd)
        except BudgetExceeded as refused:
            outcome.refused += 1
            if len(outcome.reasons) < 3:
                outcome.reasons.append(str(refused))
            continue
        outcome.sent += 1
        yield client.device_id.encode(), data
    if outcome.refused:
        LOG.warning("%d device report(s) refused by their privacy budget, e.g. %s", outcome.refused,
                    outcome.reasons[0])
