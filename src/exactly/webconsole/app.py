"""The console's web application (Starlette, Jinja2 templates, served by uvicorn).

Routes:

* ``GET /`` - the page; ``GET /fragment`` - its content alone, which the page's script fetches
  every refresh interval and swaps in, so the page refreshes live without reloading and every
  byte of HTML comes from one set of templates;
* ``GET /api/snapshot`` - the same snapshot as JSON, for scripts and tests;
* ``POST /api/abort`` - the only action that changes the cluster: aborts a transaction by
  transactional id (``{"transactional_id": ..., "confirm": true}``) or a producer's open
  transaction on one partition (``{"topic", "partition", "producer_id", "confirm": true}``).

Every admin call runs in one dedicated worker thread (:class:`AdminWorker`: a
:class:`Gatherer` is not thread-safe and its sockets block), so a slow or dead cluster never stalls the event loop: the page keeps
answering and shows the failure. Concurrent readers share one snapshot: a snapshot younger than
half the refresh interval is served again rather than asking the cluster once per browser tab.

Why the abort endpoint wants JSON, ``confirm: true`` and a same-origin ``Origin``: the console
listens on loopback, but any web page the user visits could make the browser POST to it; a
cross-site request cannot send ``application/json`` without a CORS preflight (which this server
never grants), and a browser's same-site request carries the console's own Origin.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from exactly.client.wire import WireError
from exactly.webconsole.gather import Gatherer
from exactly.webconsole.model import Snapshot

T = TypeVar("T")
HERE = Path(__file__).parent
CLOSE_WAIT_S = 2.0


class AdminWorker:
    """One daemon thread that runs the blocking admin calls, one after the other.

    A daemon, unlike a ThreadPoolExecutor's worker (which the interpreter joins at exit), so
    stopping the console never waits for a call stuck on a hung broker until its timeout."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="exactly-console-admin", daemon=True)
        self._thread.start()

    def submit(self, call: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        self._jobs.put((call, future))
        return future

    def stop(self) -> None:
        self._jobs.put(None)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            call, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(call())
            except BaseException as exc:  # handed to the awaiting request, which decides
                future.set_exception(exc)


class Console:
    """The application's state: the gatherer, its worker thread, the latest snapshot."""

    def __init__(self, gatherer: Gatherer, *, refresh_ms: int) -> None:
        self.gatherer = gatherer
        self.refresh_ms = refresh_ms
        self._worker = AdminWorker()
        self._lock: asyncio.Lock | None = None
        self._latest: Snapshot | None = None
        self._latest_at = 0.0

    async def in_worker(self, call: Callable[[], T]) -> T:
        return await asyncio.wrap_future(self._worker.submit(call))

    async def snapshot(self) -> Snapshot:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            fresh = time.monotonic() - self._latest_at < self.refresh_ms / 2000
            if self._latest is None or not fresh:
                self._latest = await self.in_worker(self.gatherer.snapshot)
                self._latest_at = time.monotonic()
            return self._latest

    def invalidate(self) -> None:
        self._latest_at = 0.0

    async def close(self) -> None:
        """Close the connections after the calls under way, unless one is stuck: then leave
        (the worker is a daemon; the process is ending)."""
        closing = self._worker.submit(self.gatherer.close)
        self._worker.stop()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.wrap_future(closing), CLOSE_WAIT_S)


# ---------------------------------------------------------------------- template filters
def _clock(ms: int) -> str:
    if ms < 0:
        return "-"
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _duration(ms: int) -> str:
    if ms < 0:
        return "-"
    if ms < 10_000:
        return f"{ms / 1000:.1f} s"
    seconds = ms // 1000
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


def _offset(value: int) -> str:
    return "-" if value < 0 else str(value)


def make_templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.filters.update(clock=_clock, duration=_duration, offset=_offset)
    return templates


# ---------------------------------------------------------------------- the application
def create_app(gatherer: Gatherer, *, refresh_ms: int = 2000) -> Starlette:
    console = Console(gatherer, refresh_ms=refresh_ms)
    templates = make_templates()

    def context(snapshot: Snapshot) -> dict[str, Any]:
        return {"s": snapshot, "refresh_ms": refresh_ms}

    async def page(request: Request) -> Response:
        snapshot = await console.snapshot()
        return templates.TemplateResponse(request, "page.html", context(snapshot))

    async def fragment(request: Request) -> Response:
        snapshot = await console.snapshot()
        return templates.TemplateResponse(request, "_content.html", context(snapshot))

    async def snapshot_json(request: Request) -> Response:
        snapshot = await console.snapshot()
        return JSONResponse(snapshot.to_json())

    async def abort(request: Request) -> Response:
        problem = _refuse(request)
        if problem is not None:
            return JSONResponse({"ok": False, "error": problem}, status_code=403)
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"ok": False, "error": "the body is not JSON"}, status_code=400)
        try:
            action = _abort_action(console.gatherer, body)
        except ValueError as exc:
            return JSONResponse({"ok": False, "error": str(exc)}, status_code=400)
        try:
            message = await console.in_worker(action)
        except (WireError, OSError) as exc:
            return JSONResponse({"ok": False, "error": str(exc)}, status_code=502)
        finally:
            console.invalidate()
        return JSONResponse({"ok": True, "message": message})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await console.close()

    app = Starlette(
        routes=[
            Route("/", page),
            Route("/fragment", fragment),
            Route("/api/snapshot", snapshot_json),
            Route("/api/abort", abort, methods=["POST"]),
            Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
        ],
        lifespan=lifespan,
    )
    app.state.console = console
    return app


def _refuse(request: Request) -> str | None:
    """Why a POST is not from the console's own page, or None (see the module docstring)."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        return "the abort action takes an application/json body"
    origin = request.headers.get("origin")
    if origin is not None and origin != f"{request.url.scheme}://{request.headers.get('host', '')}":
        return f"cross-origin request from {origin} refused"
    return None


def _abort_action(gatherer: Gatherer, body: Any) -> Callable[[], str]:
    """The blocking call a valid abort request asks for; ValueError says what is wrong."""
    if not isinstance(body, dict):
        raise ValueError("expected a JSON object")
    if body.get("confirm") is not True:
        raise ValueError('an abort must be confirmed ("confirm": true)')
    tid = body.get("transactional_id")
    if tid is not None:
        if not isinstance(tid, str) or not tid:
            raise ValueError("transactional_id must be a non-empty string")
        return lambda: gatherer.abort_transactional_id(tid)
    topic, partition, producer_id = body.get("topic"), body.get("partition"), body.get("producer_id")
    if not isinstance(topic, str) or not topic:
        raise ValueError("give transactional_id, or topic, partition and producer_id")
    for name, value in (("partition", partition), ("producer_id", producer_id)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer")
    assert isinstance(partition, int) and isinstance(producer_id, int)
    return lambda: gatherer.abort_partition(topic, partition, producer_id)
