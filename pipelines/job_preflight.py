"""What a job command checks before any pipeline starts and before anything is created on disk.

A bad spec, a misspelt ``--runner`` or a keys directory without the job's keys used to surface from inside
a running pipeline (a 100-line traceback, exit 1) after the output, state and staging directories had been
made. Here each is one line and its exit code, with nothing left behind:

- the specs are loaded before Beam is imported (``spec_errors``): a typo in a TOML costs no Beam start-up;
- the runner name is resolved the way Beam will resolve it (exit 2 naming the closest known runner);
- flags that cannot take effect and the ``--kafka_config`` file, as the job itself would refuse them;
- the keys the job will load are loaded now, with the same functions (exit 3 naming the file and the fix).
"""

from __future__ import annotations

import difflib
import importlib.util
from collections.abc import Callable, Sequence
from pathlib import Path

from pipelines.exit_codes import ConfigError, JobUsageError
from pipelines.job_flags import esa_parser


def _esa_values(argv: Sequence[str]) -> object:
    """The esa flags' values of a job command line (Beam's and unknown flags are left for later)."""
    parser = esa_parser("esa")
    parser.add_argument("--runner", default=None)
    values, _ = parser.parse_known_args(list(argv))
    return values


def check_specs(argv: Sequence[str]) -> None:
    """Load every ``--spec`` (ConfigError, exit 3, naming the file and the field). Imports no Beam."""
    from transforms.spec import SpecError, load_spec

    for path in getattr(_esa_values(argv), "spec", []):
        try:
            load_spec(path)
        except SpecError as err:
            raise ConfigError(str(err)) from None


def check_runner(name: str | None) -> None:
    """A ``--runner`` Beam can create: a known name (any case, ``Runner`` suffix optional, as Beam accepts
    them) or the dotted path of an importable module's class. Else JobUsageError (exit 2) with the closest."""
    if not name:
        return
    from apache_beam.options.pipeline_options import StandardOptions

    known = list(StandardOptions.KNOWN_RUNNER_NAMES)
    lowered = {n.lower() for n in known}
    if name.lower() in lowered or name.lower() + "runner" in lowered or name == "FnApiRunner":
        return
    if "." in name:
        module, _, attribute = name.rpartition(".")
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if found and hasattr(importlib.import_module(module), attribute):
            return
        raise JobUsageError(f"--runner {name}: no class {attribute} in an importable module {module}")
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise JobUsageError(f"--runner {name}: not a Beam runner{hint}; known: {', '.join(sorted(set(known)))}")


def _key_loaders(command: str) -> list[Callable[[Path], object]]:
    """The key loaders the job's pipeline calls (the same functions, so the check cannot drift from the use)."""
    from transforms.trust import keys
    from transforms.trust.devices import SimulatedFleet

    encode = [keys.load_analyzer_public, keys.load_shuffler_sealing_public, SimulatedFleet.from_keys_dir]
    # Not the device registry: a missing one is read as empty, and devices may enrol through a topic instead.
    shuffle = [keys.load_shuffler_signer, keys.load_shuffler_sealing_private, keys.load_analyzer_publics]
    analyze = [keys.load_analyzer_private, keys.load_shuffler_verifiers]
    return {"encode": encode, "shuffle": shuffle, "analyze": analyze}.get(command, encode + shuffle + analyze)


def check_keys(command: str, keys_dir: Path) -> None:
    """The keys ``command`` needs are in ``keys_dir`` and readable; ConfigError (exit 3) with the fix if not."""
    from transforms.trust.files import KeyFileError

    init = f"python -m transforms.trust init {keys_dir}"
    if not keys_dir.is_dir():
        raise ConfigError(f"--keys_dir {keys_dir}: no such directory; create the keys with `{init}` (esa simulate "
                          "also enrols its devices there), or give --keys_dir of existing keys")
    for load in _key_loaders(command):
        try:
            load(keys_dir)
        except (KeyFileError, OSError, ValueError) as err:
            raise ConfigError(f"--keys_dir {keys_dir}: {_reason(err)}; `{init}` creates what is missing") from None


def _reason(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text.replace(" (create keys with init_keys)", "")


def keys_dir_of(argv: Sequence[str]) -> Path | None:
    """``--keys_dir``, or the default beside ``--output_dir`` (None when the output is a URL: refused later)."""
    from pipelines.paths import output_location

    values = _esa_values(argv)
    if values.keys_dir:
        return Path(values.keys_dir)
    where = output_location(values.output_dir)
    return None if where.local is None else where.local.with_name(where.local.name + ".keys")


def check_job(command: str, argv: Sequence[str]) -> None:
    """Everything a job can be refused for before it starts (the specs were checked before Beam): the runner
    (exit 2), the flags that cannot take effect and the Kafka settings file (exit 3, as ``config_from_options``
    refuses them, which checks them again), then the keys (exit 3). Nothing is created."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines.job_config import check_kafka_io
    from pipelines.options import EsaKafkaOptions, load_kafka_config
    from pipelines.runners import check_streaming

    values = _esa_values(argv)
    if not values.spec:
        raise JobUsageError("at least one --spec FILE.toml is required")
    check_runner(values.runner)
    options = PipelineOptions(list(argv))
    check_kafka_io(options)
    check_streaming(options)
    kafka = options.view_as(EsaKafkaOptions)
    load_kafka_config(kafka.kafka_config, kafka.kafka_client)
    keys_dir = keys_dir_of(argv)
    if keys_dir is not None:
        check_keys(command, keys_dir)
