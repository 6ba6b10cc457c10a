"""Flex Template entry point: ``esa run`` with the template's parameters (``--name=value``) as its flags.

The launcher runs this file with the parameters of ``metadata.json`` plus Dataflow's own options. The job
graph, its options and the record accounting are those of ``pipelines.end_to_end``; nothing is specific to
the template except this shim.
"""

from __future__ import annotations

import logging
import sys

from pipelines.cli import main

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    sys.exit(main(["run", *sys.argv[1:]]))
