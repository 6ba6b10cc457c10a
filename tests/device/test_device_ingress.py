"""The shuffler's ingress accepts what the device client sends: decoded, in a served crowd, channels the
mechanism has (presence marker included), signature verified against the enrolment registry."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from apache_beam.pvalue import TaggedOutput

from tests.device.helpers import T0, client_kwargs, histogram_spec, shuffler_keys_dir
from transforms.device import Client
from transforms.io.kafka.bounded import KafkaRecord
from transforms.shuffler.elements import TimePolicy
from transforms.shuffler.ingress import IngressFn
from transforms.state.prior_runs import PriorRuns
from transforms.trust.devices import DeviceRegistry
from transforms.wire.rows import PRESENCE


@pytest.mark.parametrize(("mechanism", "eps", "params"), [("grr", 1.0, {}), ("olh", 2.0, {}), ("rappor", 4.0, {}),
                                                          ("rappor_fragments", 4.0, {"fragments": 3})])
def test_ingress_authenticates_client_message_sets(tmp_path, mechanism, eps, params):
    spec = histogram_spec(mechanism, eps, d=8, **params)
    client = Client(spec, tmp_path / "device", rng=np.random.default_rng(9), **client_kwargs())
    stranger = Client(spec, tmp_path / "stranger", **client_kwargs())  # never enrolled
    registry = DeviceRegistry()
    registry.enroll([client.public_key])
    registry.save(tmp_path / "devices.parquet")
    now_ms = int(T0 * 1000)
    fn = IngressFn([spec], str(tmp_path / "devices.parquet"), PriorRuns(), TimePolicy(now_ms, 86_400_000, 60_000),
                   keys_dir=shuffler_keys_dir(tmp_path / "keys"))
    fn.setup()
    records = [KafkaRecord("ingest", 0, i, now_ms, None, c.encode(3, event_time_ms=now_ms - 1000))
               for i, c in enumerate([client, client, stranger])]
    out = list(fn.process(records))
    dead = [o.value for o in out if isinstance(o, TaggedOutput) and o.tag == "dead_letters"]
    sets = [item for o in out if not isinstance(o, TaggedOutput) for item in pickle.loads(o[1])]
    assert len(sets) == 2 and {s.device_id for s in sets} == {client.device_id}
    assert len(dead) == 1 and "unauthenticated" in dead[0]["reason"]
    channels = [c for c, _ in sets[0].messages]
    assert (channels[0] == PRESENCE) == (mechanism in ("rappor", "rappor_fragments"))
