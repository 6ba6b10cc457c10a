"""The runners that really stream, for the window and graph tests: Beam's Python direct runner, and Prism
(Beam's portable Go runner, from the project's cache; its workers LOOPBACK, in this process)."""

from __future__ import annotations

import pytest
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner

STREAMING_RUNNERS = ["direct", pytest.param("prism", marks=pytest.mark.slow)]


def streaming_runner(name: str) -> tuple[object, PipelineOptions]:
    """(runner object or None, options with ``streaming`` set) for ``beam.Pipeline(runner=..., options=...)``."""
    if name == "direct":
        runner, options = BundleBasedDirectRunner(), PipelineOptions([])
    else:
        from pipelines.runners import prism_binary

        # A job server of this pipeline's own: Beam otherwise shares one Prism server per process, built from the
        # options of whichever pipeline came first (in a whole suite, one without --prism_location: a download).
        runner, options = None, PipelineOptions(["--runner=PrismRunner", f"--prism_location={prism_binary()}",
                                                 "--environment_type=LOOPBACK",
                                                 "--experiments=disable_prism_server_singleton"])
    options.view_as(StandardOptions).streaming = True
    return runner, options
