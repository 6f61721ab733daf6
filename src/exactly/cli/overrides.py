"""``-o KEY=VALUE`` broker-config overrides, parsed one way for ``exactly serve`` and ``exactly cluster``."""

from __future__ import annotations

import sys


def parse_overrides(items: list[str], command: str) -> dict[str, str] | None:
    """``{key: value}`` from ``KEY=VALUE`` items (whitespace around either stripped), or None after
    printing ``exactly <command>: -o expects KEY=VALUE, got ...`` for the first malformed item."""
    overrides: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"exactly {command}: -o expects KEY=VALUE, got {item!r}", file=sys.stderr)
            return None
        overrides[key.strip()] = value.strip()
    return overrides
