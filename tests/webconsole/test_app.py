"""``exactly console`` run as a subprocess: its JSON and HTML endpoints, the abort action's
checks, and a cluster that fails or does not answer (the page says so; the server keeps serving)."""

from __future__ import annotations

import json
import signal
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from exactly.testing.wait import wait_until
from tests.webconsole.conftest import ConsoleFactory, Scenario

pytestmark = pytest.mark.timeout(120)


def get(url: str, timeout: float = 30) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.status, response.read().decode()


def snapshot(url: str) -> dict[str, Any]:
    status, body = get(url + "api/snapshot")
    assert status == 200
    return json.loads(body)  # type: ignore[no-any-return]


def post(
    url: str, body: object, *, content_type: str = "application/json", origin: str | None = None
) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": content_type}
    if origin is not None:
        headers["Origin"] = origin
    request = urllib.request.Request(
        url + "api/abort", data=json.dumps(body).encode(), headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def txn_of(snap: dict[str, Any], tid: str) -> dict[str, Any]:
    (found,) = [t for t in snap["transactions"] if t["transactional_id"] == tid]
    return found


def test_json_and_html_show_the_scenario(scenario: Scenario, console: ConsoleFactory) -> None:
    s = scenario
    url = console(s.bootstrap).url
    snap = wait_until(
        lambda: (lambda j: j if txn_of(j, s.hanging_id)["hanging_reason"] else None)(snapshot(url)),
        30,
        "the hanging transaction flagged",
    )
    assert snap["errors"] == [] and snap["hanging_count"] == 2
    assert txn_of(snap, s.open_id)["open"] is True and txn_of(snap, s.open_id)["hanging_reason"] == ""
    assert txn_of(snap, s.committed_id)["state"] == "CompleteCommit"
    parts = {p["partition"]: p for p in snap["partitions"] if p["topic"] == s.topic}
    assert (parts[0]["high_watermark"], parts[0]["lso"], parts[0]["lso_lag"]) == (5, 4, 1)
    (group,) = [g for g in snap["groups"] if g["group_id"] == s.group]
    assert group["total_lag"] == 3

    status, page = get(url)
    assert status == 200 and "<title>exactly console" in page and f'data-tid="{s.hanging_id}"' in page
    status, fragment = get(url + "fragment")
    assert status == 200 and "<html" not in fragment and f'data-group="{s.group}"' in fragment
    status, script = get(url + "static/console.js")
    assert status == 200 and "api/abort" in script


def test_abort_needs_json_confirmation_and_the_same_origin(
    scenario: Scenario, console: ConsoleFactory
) -> None:
    s = scenario
    url = console(s.bootstrap).url
    good = {"transactional_id": s.open_id, "confirm": True}
    assert post(url, {"transactional_id": s.open_id})[0] == 400  # not confirmed
    assert post(url, {**good, "confirm": "yes"})[0] == 400
    assert post(url, good, content_type="text/plain")[0] == 403  # what a cross-site form can send
    assert post(url, good, origin="http://evil.example")[0] == 403
    assert post(url, {"topic": s.topic, "partition": -1, "producer_id": 0, "confirm": True})[0] == 400
    assert post(url, {"topic": s.topic, "partition": 0, "producer_id": True, "confirm": True})[0] == 400
    assert post(url, [1, 2])[0] == 400
    assert txn_of(snapshot(url), s.open_id)["open"] is True  # none of those touched it

    status, answer = post(url, {"transactional_id": "no-such-id", "confirm": True})
    assert status == 502 and "not found" in answer["error"]

    status, answer = post(url, good, origin=url.rstrip("/"))
    assert status == 200 and answer["ok"], answer
    assert answer["message"].startswith(f"Aborted the Ongoing transaction of '{s.open_id}'")
    wait_until(lambda: not txn_of(snapshot(url), s.open_id)["open"], 30, "the aborted transaction closed")


def test_an_unreachable_cluster_shows_as_an_error_on_the_page(console: ConsoleFactory) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, not listening: refused
        port = sock.getsockname()[1]
        running = console(f"127.0.0.1:{port}")
        status, page = get(running.url)
        assert status == 200 and "Errors talking to the cluster" in page and "Metadata: " in page
        assert snapshot(running.url)["errors"]
        status, answer = post(running.url, {"transactional_id": "x", "confirm": True})
        assert status == 502 and answer["ok"] is False
        assert running.process.poll() is None


@pytest.fixture
def silent_broker() -> Iterator[tuple[str, list[socket.socket]]]:
    """A listener that accepts connections and never answers (a hung broker)."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{listener.getsockname()[1]}", accepted
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    listener.close()


def test_a_hung_cluster_does_not_block_the_server(
    console: ConsoleFactory, silent_broker: tuple[str, list[socket.socket]]
) -> None:
    address, accepted = silent_broker
    running = console(address, "--request-timeout", "60")
    done = threading.Event()

    def slow() -> None:
        try:
            get(running.url + "api/snapshot", timeout=120)
        except OSError:  # a 500 once the console stops under it below
            pass
        finally:
            done.set()

    threading.Thread(target=slow, daemon=True).start()
    wait_until(lambda: accepted, 30, "the console connected to the silent broker")
    # the snapshot is stuck waiting 60 s for an answer; the server still answers other requests
    status, css = get(running.url + "static/console.css")
    assert status == 200 and "table" in css
    assert not done.is_set()
    # nor does it hold up stopping the console (the stuck call would take 60 s); uvicorn
    # re-raises the SIGTERM it caught once it has shut down
    running.process.terminate()
    assert running.process.wait(timeout=30) in (0, -signal.SIGTERM)
