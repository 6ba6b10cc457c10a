"""Output locations that may be local directories or URLs (``gs://bucket/esa``, ``s3://...``).

``Path("gs://bucket/esa")`` silently becomes ``gs:/bucket/esa``; an :class:`OutputLocation` keeps a URL a
string joined with ``/`` and a local location a :class:`~pathlib.Path`, and turns a local directory that
cannot be created into one clear line (:class:`OutputLocationError`) instead of a traceback.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from pipelines.exit_codes import ConfigError

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class OutputLocationError(ConfigError):
    """A local output directory cannot be created or written (permission, a file in the way)."""


def is_url(location: str | Path) -> bool:
    """True for ``scheme://...`` (gs, s3, hdfs, ...); ``file://`` counts as local."""
    text = str(location)
    return bool(_URL.match(text)) and not text.lower().startswith("file://")


@dataclass(frozen=True)
class OutputLocation:
    """Where a job writes: ``local`` (a Path) or ``url`` (a string without a trailing slash)."""

    local: Path | None = None
    url: str | None = None

    @classmethod
    def parse(cls, location: str | Path | OutputLocation) -> OutputLocation:
        if isinstance(location, OutputLocation):
            return location
        text = str(location)
        if not text:
            raise OutputLocationError("the output location is empty")
        if is_url(text):
            return cls(url=text.rstrip("/"))
        if text.lower().startswith("file://"):
            text = text[len("file://"):]
        return cls(local=Path(text))

    @property
    def is_url(self) -> bool:
        return self.url is not None

    def join(self, *parts: str) -> Path | str:
        """A file or folder under this location: a Path locally, ``url/part/...`` for a URL."""
        if self.local is not None:
            return self.local.joinpath(*parts)
        return "/".join([self.url or "", *(p.strip("/") for p in parts)])

    def prepare(self) -> OutputLocation:
        """Create a local directory (parents too); raise one clear line if that is impossible. URLs are left
        to the filesystem that writes them (object stores have no directories to create)."""
        if self.local is None:
            return self
        path = self.local
        try:
            path.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise OutputLocationError(f"cannot use {path} as the output directory: a file is in the way") from None
        except NotADirectoryError:
            blocker = next((p for p in [path, *path.parents] if p.exists() and not p.is_dir()), path)
            raise OutputLocationError(f"cannot create output directory {path}: {blocker} is a file, not a "
                                      "directory") from None
        except PermissionError:
            raise OutputLocationError(f"cannot create output directory {path}: permission denied") from None
        except OSError as err:
            raise OutputLocationError(f"cannot create output directory {path}: {err.strerror or err}") from None
        if not path.is_dir():
            raise OutputLocationError(f"cannot use {path} as the output directory: it is not a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise OutputLocationError(f"cannot write to output directory {path}: permission denied")
        return self

    def __str__(self) -> str:
        return str(self.local) if self.local is not None else str(self.url)


def output_location(location: str | Path | OutputLocation) -> OutputLocation:
    """Parse a ``--output_dir``/``--out`` value (see :class:`OutputLocation`)."""
    return OutputLocation.parse(location)
