"""Checks a job makes before it starts: the broker answers and the topics it reads exist.

Reading a topic that does not exist would auto-create it (or wait forever) and a typo such as
``--shuffled_topic shufled`` would then run a job over nothing; :func:`require_topics` refuses instead and
lists the topics the broker does have.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable

from pipelines.exit_codes import KafkaUnavailableError

LOG = logging.getLogger(__name__)
CLIENT_ID = "esa-preflight"


class MissingTopicsError(KafkaUnavailableError):
    """Input topics that do not exist on the broker."""


def existing_topics(bootstrap: str, timeout_s: float = 15.0) -> set[str]:
    """The topic names the broker knows (internal ``__`` topics left out); KafkaUnavailableError if it is
    unreachable."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    timeout_ms = int(timeout_s * 1000)
    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id=CLIENT_ID, request_timeout_ms=timeout_ms,
                                 bootstrap_timeout_ms=timeout_ms)
    except (KafkaError, OSError, ValueError) as err:
        raise KafkaUnavailableError(f"cannot reach Kafka at {bootstrap}: {err}") from None
    try:
        return {t for t in admin.list_topics() if not t.startswith("__")}
    except (KafkaError, OSError) as err:
        raise KafkaUnavailableError(f"cannot list the topics of Kafka at {bootstrap}: {err}") from None
    finally:
        admin.close()


def require_topics(bootstrap: str, topics: Iterable[str], timeout_s: float = 15.0) -> None:
    """Raise :class:`MissingTopicsError` naming every topic of ``topics`` the broker lacks (with the closest
    existing name, and the existing topics) so that a typo does not create a new, empty topic."""
    wanted = [t for t in dict.fromkeys(topics) if t]
    if not wanted:
        return
    have = existing_topics(bootstrap, timeout_s)
    missing = [t for t in wanted if t not in have]
    if not missing:
        return
    hints = []
    for topic in missing:
        close = difflib.get_close_matches(topic, sorted(have), n=1, cutoff=0.6)
        hints.append(f"{topic!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    listing = ", ".join(sorted(have)) if have else "none"
    raise MissingTopicsError(f"topic(s) {', '.join(hints)} do not exist on {bootstrap}; existing topics: {listing}")
