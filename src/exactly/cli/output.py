"""Machine-readable output: ``--json`` prints one JSON document on stdout.

The documents' keys are stable (snake_case, the same keys whatever the broker answered; a value
that is absent is ``null``, never a missing key), so scripts can rely on them. Human-readable
tables stay the default. Errors still go to stderr as one line with exit code 1; a command that
found part of what was asked (``txn describe`` of a known and an unknown id) prints the document
of what it found before failing.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["add_json_option", "print_json"]


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print one JSON document on stdout (stable keys, for scripts)"
    )


def print_json(document: dict[str, Any]) -> None:
    print(json.dumps(document, indent=2, sort_keys=True), flush=True)
