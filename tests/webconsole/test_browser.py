"""The console in a real browser: Debian's headless Chromium driven by Playwright opens the page
against a broker with an open, a committed and two hanging transactions (one overdue at its
coordinator, one orphan on a partition: see conftest.py), checks what it shows, aborts both
through the confirmation dialog and sees them end.

Screenshots are kept as test artifacts: in ``$EXACTLY_CONSOLE_SCREENSHOTS`` when set (CI uploads
that directory; docs/console.png was taken this way), else in the test's tmp dir. A missing
Chromium fails the test: the set-up (scripts/ensure-system-deps.sh) installs it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.webconsole.conftest import ConsoleFactory, Scenario

pytestmark = pytest.mark.timeout(180)

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 30_000


@pytest.fixture
def browser() -> Iterator[Browser]:
    assert CHROMIUM.exists(), (
        f"{CHROMIUM} is missing: run scripts/ensure-system-deps.sh (apt-get install chromium)"
    )
    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    chosen = os.environ.get("EXACTLY_CONSOLE_SCREENSHOTS")
    path = Path(chosen) if chosen else tmp_path / "screenshots"
    path.mkdir(parents=True, exist_ok=True)
    return path


def txn_row(page: Page, tid: str):  # type: ignore[no-untyped-def]
    return page.locator(f'tr.txn[data-tid="{tid}"]')


def test_the_console_shows_transactions_producers_and_lag_and_aborts_a_hanging_one(
    scenario: Scenario, console: ConsoleFactory, browser: Browser, screenshots: Path
) -> None:
    s = scenario
    url = console(s.bootstrap).url
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    page.goto(url)
    expect(page).to_have_title(re.compile("exactly console"))

    # live: the content is replaced by newer snapshots without a reload
    taken = page.locator("#snapshot").get_attribute("data-taken-at")
    expect(page.locator("#snapshot")).not_to_have_attribute("data-taken-at", taken or "", timeout=WAIT_MS)

    hanging = txn_row(page, s.hanging_id)
    expect(hanging).to_have_class(re.compile(r"\bhanging\b"), timeout=WAIT_MS)
    expect(hanging.locator(".badge")).to_have_text("hanging")
    expect(hanging).to_contain_text("Ongoing")
    expect(hanging).to_contain_text(f"{s.topic}-1")
    expect(hanging.locator(".badge")).to_have_attribute("title", re.compile(r"past its 1000 ms timeout"))

    opened = txn_row(page, s.open_id)
    expect(opened).to_contain_text("Ongoing")
    expect(opened).to_contain_text(f"{s.topic}-0")
    expect(opened).not_to_have_class(re.compile(r"\bhanging\b"))
    expect(opened.locator("button.abort")).to_be_visible()

    committed = txn_row(page, s.committed_id)
    expect(committed).to_contain_text("CompleteCommit")
    expect(committed.locator("button.abort")).to_have_count(0)

    # partitions: LSO held back by the open transactions
    expect(page.locator(f'tr.partition[data-tp="{s.topic}-0"] td').nth(6)).to_have_text("4")
    expect(page.locator(f'tr.partition[data-tp="{s.topic}-1"] td').nth(6)).to_have_text("0")
    # producers: the committed one, the open one (first offset 4) on partition 0, the hanging one on 1
    expect(page.locator(f'tr.producer[data-tp="{s.topic}-0"]')).to_have_count(2)
    expect(page.locator(f'tr.producer.open[data-tp="{s.topic}-0"] td').nth(6)).to_have_text("4")
    expect(page.locator(f'tr.producer.open[data-tp="{s.topic}-1"] td').nth(6)).to_have_text("0")
    # the group's read_committed lag: LSO 4 - committed 1
    # the orphan: flagged on its partition, which it holds at LSO 2
    orphan = page.locator(f'tr.producer[data-tp="{s.stuck_topic}-0"][data-pid="{s.late_pid}"]')
    expect(orphan).to_have_class(re.compile(r"\bhanging\b"))
    expect(orphan.locator("td").nth(6)).to_have_text("2 hanging")
    expect(page.locator(f'tr.partition[data-tp="{s.stuck_topic}-0"] td').nth(6)).to_have_text("2")
    expect(page.locator("#hanging-count")).to_have_text("2 hanging")
    group = page.locator(f'.group[data-group="{s.group}"]')
    expect(group.locator("tr.group-offset td.lag")).to_have_text("3")
    expect(group).to_contain_text("Stable")
    page.screenshot(path=str(screenshots / "console.png"), full_page=True)

    # Cancel in the dialog changes nothing
    opened.locator("button.abort").click()
    expect(page.locator("#confirm")).to_be_visible()
    page.locator("#confirm-cancel").click()
    expect(page.locator("#confirm")).to_be_hidden()
    expect(page.locator("#flash")).to_be_hidden()

    # abort the hanging one: the dialog names it; confirming ends it
    hanging.locator("button.abort").click()
    expect(page.locator("#confirm-text")).to_contain_text(s.hanging_id)
    page.locator("#confirm-abort").click()
    expect(page.locator("#flash")).to_contain_text(
        f"Aborted the Ongoing transaction of '{s.hanging_id}'", timeout=WAIT_MS
    )
    expect(hanging.locator("td.state")).to_have_text(re.compile(r"^(Empty|CompleteAbort)$"), timeout=WAIT_MS)
    expect(hanging).not_to_have_class(re.compile(r"\bhanging\b"))
    expect(hanging.locator("button.abort")).to_have_count(0)
    expect(page.locator(f'tr.partition[data-tp="{s.topic}-1"] td').nth(6)).to_have_text("2", timeout=WAIT_MS)
    expect(opened).to_contain_text("Ongoing")  # the other one is untouched

    # abort the orphan on its partition: an ABORT marker frees the LSO
    orphan.locator("button.abort").click()
    expect(page.locator("#confirm-text")).to_contain_text(f"{s.stuck_topic}-0")
    page.locator("#confirm-abort").click()
    expect(page.locator("#flash")).to_contain_text(
        f"Wrote an ABORT marker for producer {s.late_pid} on {s.stuck_topic}-0", timeout=WAIT_MS
    )
    expect(page.locator(f'tr.partition[data-tp="{s.stuck_topic}-0"] td').nth(6)).to_have_text(
        "4", timeout=WAIT_MS
    )
    expect(orphan).not_to_have_class(re.compile(r"\bhanging\b"))
    expect(page.locator("#hanging-count")).to_have_count(0)
    page.screenshot(path=str(screenshots / "console-after-abort.png"), full_page=True)
