"""The one error the local broker raises: every cause (no Java, no jars, a taken port, a crash) is a line."""

from pipelines.exit_codes import KafkaUnavailableError


class BrokerError(KafkaUnavailableError):
    """The local broker could not be found, fetched, started or kept running (exit 4).

    ``str()`` is one line naming the cause; ``detail`` holds the broker log's last lines, for a test
    harness or a ``-v`` run, never for the one-line message an operator reads first."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail
