"""Attach broker output to failing tests' reports (used by tests/conftest.py)."""

from __future__ import annotations

import pytest

from tests.support.broker import Broker

USED_BROKERS = pytest.StashKey[list[tuple[Broker, int]]]()
REPORT_TAIL = 12_000


def note_broker(request: pytest.FixtureRequest, broker: Broker, since: int | None = None) -> Broker:
    """Show ``broker``'s output (from now, or from byte ``since``) if this test fails."""
    used = request.node.stash.setdefault(USED_BROKERS, [])
    used.append((broker, broker.log_size() if since is None else since))
    return broker


def broker_sections(item: pytest.Item) -> list[tuple[str, str]]:
    sections = []
    for broker, since in item.stash.get(USED_BROKERS, []):
        text = broker.log_text(since)
        if len(text) > REPORT_TAIL:
            text = "...\n" + text[-REPORT_TAIL:]
        sections.append((f"{broker.name} output ({broker.log_path})", text or "(nothing)"))
    return sections
