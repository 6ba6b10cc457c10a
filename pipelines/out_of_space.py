"""Recognizing a write the OS refused for lack of space, wherever in a job it happened.

A full disk, an exhausted quota or a file-size limit can hit any write of a run: a spill file inside a Beam
worker, a staged part, the ledger, the run state, a Parquet part. Every one of those writes is either redone
by the next run (staging is keyed by the input range) or published atomically (ledger, releases, state,
estimates), so the right answer to the operator is one line and a distinct exit code, not a Beam traceback.
Beam re-raises a worker's exception as a ``RuntimeError`` carrying only its text, and a portable runner's
worker runs in another process, so the error is recognized both by type and by the OS's words in the text.
"""

from __future__ import annotations

import errno
import os
import re

OUT_OF_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_CODES = "|".join(str(code) for code in sorted(OUT_OF_SPACE_ERRNOS))
_WORDS = re.compile(rf"\[Errno (?:{_CODES})\] [^\n\[:']*(?:: '[^'\n]*')?")  # the strerror, then the path


def out_of_space(err: BaseException) -> str | None:
    """The OS's words (``[Errno 28] No space left on device: '<path>'``) if ``err`` or an exception behind it
    is a write refused for lack of space; None otherwise."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in OUT_OF_SPACE_ERRNOS:
            where = f": {current.filename!r}" if current.filename is not None else ""
            return f"[Errno {current.errno}] {current.strerror or os.strerror(current.errno)}{where}"
        found = _WORDS.search(str(current))
        if found:
            return found.group(0).strip()
        current = current.__cause__ or current.__context__
    return None


def out_of_space_advice(words: str) -> str:
    """What the operator reads: what happened, that nothing is lost or released twice, and what to do."""
    return (f"out of space: {words}. Nothing is lost and nothing will be released twice: what this run had "
            "not finished is redone by the next one. Free space (or raise the quota) under the state, keys, "
            "staging and output locations, then start the job again with the same flags")
