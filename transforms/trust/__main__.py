"""Operate a keys directory: ``python -m transforms.trust {init,rotate,enroll,show} KEYS_DIR``.

* ``init`` creates whatever is missing (idempotent);
* ``rotate analyzer|shuffler|shuffler-seal`` adds a new key that senders and signers use from now on; old ids stay
  so that what was sealed or signed before keeps opening and verifying (delete retired files by hand);
* ``enroll`` enrols devices from a file of hex-encoded Ed25519 public keys, one per line (``-`` = stdin): with
  ``--kafka_bootstrap``, as records of the compacted devices topic (``transforms.trust.enrolment``), which the
  shuffler reads at its next run; with ``--legacy_registry``, into ``registry/devices.parquet`` as before
  (the shuffler imports that file once per version of it);
* ``show`` lists key ids and the number of enrolled devices, never key material.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from .devices import DeviceRegistry
from .files import KeyFileError
from .keys import (
    generate_analyzer_key,
    generate_shuffler_key,
    generate_shuffler_sealing_key,
    init_keys,
    load_analyzer_private,
    load_analyzer_public,
    load_shuffler_verifiers,
)

REGISTRY = Path("registry") / "devices.parquet"


def _read_keys(source: str) -> list[bytes]:
    text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="ascii")
    keys = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if line and not line.startswith("#"):
            try:
                keys.append(bytes.fromhex(line))
            except ValueError:
                raise ValueError(f"{source}:{number}: not a hex public key") from None
    return keys


def _enroll_topic(args: argparse.Namespace) -> dict[str, object]:
    """The devices topic's writer lives with the Kafka code (``pipelines.enrolment``): this package stays pure,
    only its command line reaches out (the one import the import-linter contracts allow it)."""
    from pipelines.enrolment import enrol_keys
    from pipelines.options import load_kafka_config

    keys = _read_keys(args.public_keys)
    config = load_kafka_config(args.kafka_config, args.kafka_client) if args.kafka_config else {}
    sent = enrol_keys(args.kafka_bootstrap, args.devices_topic, keys, kafka_config=config, client=args.kafka_client)
    return {"read": len(keys), "written": sent, "topic": args.devices_topic,
            "note": "enrolments count from the shuffler's next run"}


def _enroll(keys_dir: Path, source: str) -> dict[str, object]:
    keys = _read_keys(source)
    registry = DeviceRegistry.load(keys_dir / REGISTRY)
    before = len(registry)
    registry.enroll(keys)
    registry.save(keys_dir / REGISTRY)
    return {"read": len(keys), "added": len(registry) - before, "enrolled": len(registry)}


def _show(keys_dir: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    try:
        out["analyzer_private"] = sorted(load_analyzer_private(keys_dir))
    except KeyFileError as err:
        out["analyzer_private"] = f"unavailable: {err}"
    out["analyzer_public_newest"] = load_analyzer_public(keys_dir)[0]
    out["shuffler_public"] = sorted(load_shuffler_verifiers(keys_dir))
    out["enrolled_devices"] = len(DeviceRegistry.load(keys_dir / REGISTRY))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m transforms.trust", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("init").add_argument("keys_dir", type=Path)
    rotate = sub.add_parser("rotate")
    rotate.add_argument("domain", choices=["analyzer", "shuffler", "shuffler-seal"])
    rotate.add_argument("keys_dir", type=Path)
    enroll = sub.add_parser("enroll")
    enroll.add_argument("keys_dir", type=Path)
    enroll.add_argument("public_keys", help="file of hex Ed25519 public keys, one per line; - for stdin")
    target = enroll.add_mutually_exclusive_group(required=True)
    target.add_argument("--kafka_bootstrap", metavar="H:P", help="write enrolments to the devices topic here")
    target.add_argument("--legacy_registry", action="store_true",
                        help="edit KEYS_DIR/registry/devices.parquet instead (deprecated: rewritten whole)")
    enroll.add_argument("--devices_topic", default="devices", help="the compacted devices topic (default devices)")
    enroll.add_argument("--kafka_client", default="confluent", choices=["confluent", "kafka-python"])
    enroll.add_argument("--kafka_config", default="", metavar="FILE", help="extra Kafka client settings (TLS/SASL)")
    sub.add_parser("show").add_argument("keys_dir", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "init":
            result: object = init_keys(args.keys_dir)
        elif args.command == "rotate":
            make = {"analyzer": generate_analyzer_key, "shuffler": generate_shuffler_key,
                    "shuffler-seal": generate_shuffler_sealing_key}[args.domain]
            result = {"domain": args.domain, "key_id": make(args.keys_dir)}
        elif args.command == "enroll" and args.kafka_bootstrap:
            result = _enroll_topic(args)
        elif args.command == "enroll":
            result = _enroll(args.keys_dir, args.public_keys)
        else:
            result = _show(args.keys_dir)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:  # Kafka refused or unreachable (KafkaWriteError): the jobs' exit code 4
        print(f"error: {err}", file=sys.stderr)
        return 4
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
