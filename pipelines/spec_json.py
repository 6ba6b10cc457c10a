"""``esa spec-json SPEC [--out FILE]``: a spec exported for device SDKs (``transforms.device.spec_export``).

A web page or app ships this JSON beside the SDK (``docs/sdk-web.md``); re-export it whenever the spec changes
(its ``spec_id`` changes with it, and reports under an old id are dead-lettered by the shuffler).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pipelines.exit_codes import ExitCode


def spec_json_command(spec_path: Path, out: Path | None) -> int:
    from transforms.device.spec_export import spec_json
    from transforms.spec import load_spec

    spec = load_spec(spec_path)
    try:
        exported = spec_json(spec)
    except ValueError as err:
        print(f"esa spec-json: error: {spec_path}: {err}", file=sys.stderr)
        return int(ExitCode.CONFIG)
    text = json.dumps(exported, indent=1, sort_keys=True) + "\n"
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text)
    return 0
