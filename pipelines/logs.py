"""Logging of the ``esa`` command: the project's own lines at INFO (DEBUG with ``-v``), third-party at WARNING.

Why per-logger levels and not the root's: Python's root logger *is* ``getLogger("root")`` (3.9+), so quieting
Beam by setting "root" to WARNING silenced every esa line too, and a ``--follow`` job printed nothing while it
ran. Here the root logger stays at WARNING (Beam, Kafka clients, gRPC: only their warnings), and the project's
loggers (``esa``, ``pipelines``, ``transforms``) get INFO, or DEBUG under ``-v``.

``--log_format json`` (or ``ESA_LOG_FORMAT=json``) writes one JSON object per line -- ``ts`` (UTC, ISO 8601),
``level``, ``logger``, ``message``, and the structured fields a line carries (``extra={"esa": {...}}``) -- for
log shippers that index fields instead of parsing text.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime

PROJECT_LOGGERS = ("esa", "pipelines", "transforms", "schemas")
LOG_FORMATS = ("text", "json")
FORMAT_ENV = "ESA_LOG_FORMAT"
# Third-party log lines that say nothing actionable to an esa user (dropped unless -v).
NOISE = ("apitools not found", "blocking the event loop")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class QuietFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(noise in message for noise in NOISE)


class JsonFormatter(logging.Formatter):
    """One JSON object per record; the ``esa`` extra (a dict) is merged in as fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        fields = getattr(record, "esa", None)
        if isinstance(fields, dict):
            line.update({k: v for k, v in fields.items() if k not in line})
        if record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, separators=(",", ":"))


def log_format(requested: str | None) -> str:
    """The format asked for on the command line, else ``$ESA_LOG_FORMAT``, else text; anything else: ValueError."""
    chosen = requested or os.environ.get(FORMAT_ENV) or "text"
    if chosen not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {chosen!r}")
    return chosen


def setup_logging(verbose: bool, fmt: str = "text") -> None:
    """(Re)configure the process's logging: one stderr handler, levels per logger (see the module doc)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_esa", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler._esa = True  # type: ignore[attr-defined]
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    if not verbose:
        handler.addFilter(QuietFilter())
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    for name in PROJECT_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.INFO)
    # Beam's and the Kafka clients' loggers may have been given levels of their own by an earlier call.
    for name in ("apache_beam", "kafka"):
        logging.getLogger(name).setLevel(logging.WARNING)
