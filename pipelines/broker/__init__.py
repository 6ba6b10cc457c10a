"""The local Apache Kafka broker: jars fetched once with Maven, a KRaft node on loopback, `esa broker`."""

from pipelines.broker.errors import BrokerError
from pipelines.broker.jars import KAFKA_VERSION, kafka_jars
from pipelines.broker.local import LocalBroker, free_loopback_port, port_free
from pipelines.broker.properties import ADMIN_USER, SaslSsl
from pipelines.broker.serve import run_broker_forever

__all__ = ["ADMIN_USER", "KAFKA_VERSION", "BrokerError", "LocalBroker", "SaslSsl", "free_loopback_port",
           "kafka_jars", "port_free", "run_broker_forever"]
