"""`make run`: the embedded broker and the orders pipeline on Spark, end to end, exactly once.

``python -m exactly.demo [--orders N] [--cluster 3 [--kill-broker-after 2]] ...`` is
``exactly pipeline demo``: see ``exactly.cli.pipeline_demo`` for what it does. Exit code 0 only
if the verification passes.
"""

from __future__ import annotations

import argparse
import sys

from exactly.cli import pipeline_demo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    pipeline_demo.add_arguments(parser)
    return pipeline_demo.main(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
