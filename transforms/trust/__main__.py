"""Operate a keys directory: ``python -m transforms.trust {init,rotate,enroll,show} KEYS_DIR``.

* ``init`` creates whatever is missing (idempotent);
* ``rotate analyzer|shuffler|shuffler-seal`` adds a new key that senders and signers use from now on; old ids stay
  so that what was sealed or signed before keeps opening and verifying (delete retired files by hand);
* ``enroll`` adds devices from a file of hex-encoded Ed25519 public keys, one per line (``-`` = stdin);
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


def _enroll(keys_dir: Path, source: str) -> dict[str, object]:
    text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="ascii")
    keys = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if line and not line.startswith("#"):
            try:
                keys.append(bytes.fromhex(line))
            except ValueError:
                raise ValueError(f"{source}:{number}: not a hex public key") from None
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
    sub.add_parser("show").add_argument("keys_dir", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "init":
            result: object = init_keys(args.keys_dir)
        elif args.command == "rotate":
            make = {"analyzer": generate_analyzer_key, "shuffler": generate_shuffler_key,
                    "shuffler-seal": generate_shuffler_sealing_key}[args.domain]
            result = {"domain": args.domain, "key_id": make(args.keys_dir)}
        elif args.command == "enroll":
            result = _enroll(args.keys_dir, args.public_keys)
        else:
            result = _show(args.keys_dir)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
