"""``esa edge`` (the HTTP ingestion edge) and ``esa edge-token`` (mint an enrolment token): flags and start-up."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import ssl
import sys
import time
from pathlib import Path
from typing import Any

from pipelines.exit_codes import ExitCode

_log = logging.getLogger("esa.edge")
ENROLMENT_SECRET = Path("shuffler") / "enrolment.key"


def add_edge_parsers(sub: Any) -> None:
    """Register ``edge`` and ``edge-token`` on the ``esa`` subcommand parser."""
    edge = sub.add_parser("edge", help="the HTTP ingestion edge: devices POST reports and enrol here")
    edge.add_argument("--kafka_bootstrap", required=True, metavar="H:P")
    edge.add_argument("--keys_dir", required=True, type=Path, metavar="K")
    edge.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    edge.add_argument("--port", type=int, default=8080, help="0 picks a free port (printed)")
    edge.add_argument("--spool_dir", type=Path, default=Path("edge-spool"), metavar="D")
    edge.add_argument("--spool_max_bytes", type=int, default=1 << 30)
    edge.add_argument("--min_free_bytes", type=int, default=256 << 20,
                      help="refuse to spool (503) when the spool's file system has less free")
    edge.add_argument("--enrolment", choices=["token", "open"], default="token")
    edge.add_argument("--reports_topic", default="reports")
    edge.add_argument("--devices_topic", default=None, help="default: the registry's topic name (devices)")
    edge.add_argument("--max_report_bytes", type=int, default=None)
    edge.add_argument("--rate_per_device", type=float, default=1.0,
                      help="reports per second a device may sustain (0: no limit)")
    edge.add_argument("--burst_per_device", type=int, default=60)
    edge.add_argument("--ack_timeout_seconds", type=float, default=2.0,
                      help="how long a report waits for Kafka before it is spooled instead")
    edge.add_argument("--tls_cert", type=Path, default=None)
    edge.add_argument("--tls_key", type=Path, default=None)
    edge.add_argument("--kafka_config", default="", metavar="FILE", help="client settings (security), key=value")
    edge.add_argument("--create_topics", action="store_true", help="create missing reports/devices topics")
    token = sub.add_parser("edge-token", help="mint an enrolment token for one device key (the app backend's job)")
    token.add_argument("--keys_dir", required=True, type=Path, metavar="K")
    token.add_argument("--public_key", required=True, help="the device's Ed25519 public key, 64 hex digits")
    token.add_argument("--ttl_seconds", type=int, default=3600)


def edge_command(args: argparse.Namespace) -> int:
    from transforms.trust.keys import load_or_create_secret

    secret = load_or_create_secret(args.keys_dir / ENROLMENT_SECRET)
    if args.command == "edge-token":
        from transforms.shuffler.edge_admission import mint_token

        try:
            public = bytes.fromhex(args.public_key)
        except ValueError:
            raise ValueError("--public_key: not hex") from None
        print(mint_token(secret, public, int(time.time()) + args.ttl_seconds))
        return 0
    return asyncio.run(_serve(args, secret))


def _tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls_cert and --tls_key go together")
    if args.tls_cert is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(args.tls_cert, args.tls_key)
    return context


def _check_port(host: str, port: int) -> None:
    """A taken port is one line and exit 3 before anything starts (uvicorn would exit 1 from inside)."""
    import socket

    from pipelines.exit_codes import ConfigError

    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            raise ConfigError(f"--port {port}: cannot listen on {host}:{port} ({err.strerror})") from None


def _ensure_topics(producer: Any, args: argparse.Namespace, devices_topic: str) -> None:
    from transforms.io.kafka.acked import ProduceError

    try:
        existing = producer.topics(10.0)
    except ProduceError as err:
        _log.warning("edge: Kafka does not answer yet (%s); reports are spooled until it does", err)
        return
    missing = [t for t in (args.reports_topic, devices_topic) if t not in existing]
    if not missing:
        return
    if not args.create_topics:
        from pipelines.exit_codes import ConfigError

        raise ConfigError(f"topic(s) {', '.join(missing)} missing on {args.kafka_bootstrap}; create them or pass "
                          f"--create_topics")
    from confluent_kafka.admin import AdminClient, NewTopic

    from transforms.io.kafka.config import to_librdkafka

    admin = AdminClient({"bootstrap.servers": args.kafka_bootstrap, **to_librdkafka(args.kafka_settings)})
    new = [NewTopic(t, num_partitions=4 if t == args.reports_topic else 1, replication_factor=-1,
                    config={"cleanup.policy": "compact"} if t == devices_topic else {}) for t in missing]
    for topic, future in admin.create_topics(new).items():
        with contextlib.suppress(Exception):  # created meanwhile by someone else: fine
            future.result(30)
        _log.info("edge: topic %s created", topic)


async def _serve(args: argparse.Namespace, secret: bytes) -> int:
    from pipelines.edge.core import Edge, EdgeSettings
    from pipelines.edge.keyring import KeyRing
    from pipelines.edge.metrics import EdgeMetrics
    from pipelines.edge.server import serve
    from pipelines.edge.spool import Spool
    from transforms.io.kafka.acked import AckedProducer
    from transforms.shuffler.edge_rules import DEFAULT_MAX_REPORT_BYTES
    from transforms.trust.enrolment import DEFAULT_DEVICES_TOPIC

    tls = _tls(args)
    _check_port(args.host, args.port)
    args.kafka_settings = {}
    if args.kafka_config:  # pipelines.options imports Beam: only when a config file is given
        from pipelines.options import load_kafka_config

        args.kafka_settings = load_kafka_config(args.kafka_config, "confluent")
    devices_topic = args.devices_topic or DEFAULT_DEVICES_TOPIC
    settings = EdgeSettings(reports_topic=args.reports_topic, devices_topic=devices_topic, enrolment=args.enrolment,
                            max_report_bytes=args.max_report_bytes or DEFAULT_MAX_REPORT_BYTES,
                            ack_timeout_s=args.ack_timeout_seconds, retry_after_s=5,
                            rate_per_device=args.rate_per_device, burst_per_device=args.burst_per_device)
    keys = KeyRing(args.keys_dir)
    spool = Spool(args.spool_dir, args.spool_max_bytes, args.min_free_bytes)
    producer = AckedProducer(args.kafka_bootstrap, args.kafka_settings)
    _ensure_topics(producer, args, devices_topic)
    edge = Edge(settings, producer, spool, keys, EdgeMetrics(), secret if args.enrolment == "token" else None)
    edge.start()
    if args.enrolment == "open":
        _log.warning("edge: ENROLMENT IS OPEN: any client that asks is enrolled as a device (demos and tests only; "
                     "use --enrolment token in production)")
    serving = await serve(edge, args.host, args.port, tls)
    port = serving.port
    records, _ = spool.depth()
    _log.info("edge: serving %s://%s:%d (reports -> %s, enrolments -> %s, enrolment %s, spool %s: %d records)",
              "https" if tls else "http", args.host, port, args.reports_topic, devices_topic, args.enrolment,
              args.spool_dir, records)
    print(f"esa edge: listening on {'https' if tls else 'http'}://{args.host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):  # uvicorn takes them while it serves, and stops; these are for after
        signal.signal(sig, lambda *_: loop.call_soon_threadsafe(stop.set))
    reload_task = asyncio.ensure_future(_reload_keys(keys, stop))
    await asyncio.wait([serving.task, asyncio.ensure_future(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
    _log.info("edge: stopping (new connections refused; spooled reports stay for the next start)")
    stop.set()
    await serving.stop()
    reload_task.cancel()
    await loop.run_in_executor(None, edge.close)
    return int(ExitCode.OK)


async def _reload_keys(keys: Any, stop: asyncio.Event) -> None:
    """Re-read the keys directory every 30 s, so a rotation reaches /v1/keys and the envelope check."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 30)
        try:
            await loop.run_in_executor(None, keys.reload)
        except (OSError, ValueError) as err:
            _log.warning("edge: keys not re-read (%s); keeping the keys in force", err)


if __name__ == "__main__":
    sys.exit(0)
