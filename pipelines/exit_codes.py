"""Exit codes of the ``esa`` command, in one place (scripts and orchestrators branch on them).

    0  OK                 the command did what it was asked
    1  UNEXPECTED         a bug or an unforeseen failure (a traceback is printed), including a run whose
                          record accounting does not balance
    2  USAGE              bad command line: unknown flag, bad value, missing argument
    3  CONFIG             bad analysis spec or configuration (the message names the file and field)
    4  KAFKA_UNREACHABLE  the broker cannot be reached, refused a request, or a retriable Kafka error
                          (no leader, coordinator loading) outlived its deadline; a topic the job reads does
                          not exist, or its cleanup policy or retention could drop records it has not read
    5  STATE_LOCKED       the job's state directory is held by another running job
    6  DEAD_LETTERS       the run finished, but a larger fraction of its records was dead-lettered than
                          ``--max_dead_letter_fraction`` allows (default 0.1)
    7  OUT_OF_SPACE       a write was refused for lack of space (full disk, quota, file-size limit); the
                          next run redoes what this one had not finished: free space and start it again
    8  STATE_UNUSABLE     a state file is corrupt or inconsistent (the message names it), a topic's log
                          ends before the job's resume offset (recreated), or the state directory is on a
                          filesystem it cannot be used on; the job refuses to guess
    9  FENCED             another shuffler took over this shuffled topic's transactional id (the documented
                          outcome of starting a second shuffler): this one stopped; what it had sealed stays in
                          its ledger, republished only if it is started again
   10  RUNNER_LOST        the runner lost the run: its Flink job server went away mid-run (killed, crashed),
                          or an earlier driver's job on the cluster would not be cancelled; a bounded run
                          released and committed nothing and its Flink job was cancelled, a streaming
                          shuffler's job was stopped into a savepoint (or left running): run the command again
  130  INTERRUPTED        stopped by SIGINT (Ctrl-C) before it finished; what it had committed stays
                          committed, and a demo that sealed nothing can use the same --out again
  143  TERMINATED         stopped by SIGTERM, likewise (a --follow job stopped by either signal after its
                          run committed exits 0)
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    UNEXPECTED = 1
    USAGE = 2
    CONFIG = 3
    KAFKA_UNREACHABLE = 4
    STATE_LOCKED = 5
    DEAD_LETTERS = 6
    OUT_OF_SPACE = 7
    STATE_UNUSABLE = 8
    FENCED = 9
    RUNNER_LOST = 10
    INTERRUPTED = 130  # 128 + SIGINT, what shells report for a Ctrl-C
    TERMINATED = 143  # 128 + SIGTERM


def epilog() -> str:
    """The table above, for ``esa --help``."""
    lines = (__doc__ or "").split("\n\n", 1)[1].rstrip()
    return "exit codes:\n" + lines


class EsaError(Exception):
    """An error the ``esa`` command reports in one line and exits with ``exit_code`` (no traceback)."""

    exit_code: ExitCode = ExitCode.UNEXPECTED


class JobUsageError(EsaError, ValueError):
    """A job's command line lacks something it needs (found after Beam parsed it)."""

    exit_code = ExitCode.USAGE


class ConfigError(EsaError, ValueError):
    """A bad spec, option value or output location."""

    exit_code = ExitCode.CONFIG


class KafkaUnavailableError(EsaError, ConnectionError):
    """The broker cannot be reached, or a topic that must exist does not."""

    exit_code = ExitCode.KAFKA_UNREACHABLE


class FencedError(EsaError):
    """A second shuffler fenced this one: it stops publishing (exit 9)."""

    exit_code = ExitCode.FENCED


class RunnerLostError(EsaError):
    """The job server went away mid-run, or an orphaned job would not be cancelled (exit 10)."""

    exit_code = ExitCode.RUNNER_LOST


class StateLockedError(EsaError):
    """Another job holds the state directory."""

    exit_code = ExitCode.STATE_LOCKED


class TooManyDeadLettersError(EsaError):
    """The run finished but dead-lettered more than the allowed fraction of its records."""

    exit_code = ExitCode.DEAD_LETTERS
