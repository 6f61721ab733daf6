"""A Kafka-aware TCP fault proxy that runs in-process on a background asyncio thread.

Clients connect to the proxy; the proxy connects to the broker (the upstream) and forwards
whole Kafka frames (int32 size + payload) both ways. Because it reads frames, it knows which
request each response answers (by correlation id), so faults can target one API, e.g. drop
only Produce responses.

Faults (all thread-safe, callable from the test thread):

* ``drop_responses(n, close=...)`` - the next ``n`` matching responses are read from the broker
  and thrown away: the request *did* reach the broker and was processed, the client never
  hears about it. ``close=True`` then closes that client connection (and its upstream), so the
  client sees a disconnect instead of a timeout.
* ``drop_every(nth, close=...)`` - every ``nth`` matching response is dropped (deterministic, for
  long runs).
* ``set_delay(seconds)`` - matching responses are held back (per connection, order kept).
* ``cut()`` - close every current connection now.
* ``blackhole(duration)`` - for ``duration`` seconds nothing is forwarded in either direction
  (bytes are read and discarded); connections that lost bytes are closed when it ends, since
  their framing is gone. New connections are accepted meanwhile.

For the client to keep talking through the proxy, the broker must advertise the proxy's address
(start it with ``-o advertised.listeners=PLAINTEXT://127.0.0.1:<proxy port>``); see
``start_listening`` + ``set_upstream`` for the order (bind first, then start the broker).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from tests.support.broker import Broker

_SIZE = struct.Struct(">i")
_REQ_HEAD = struct.Struct(">hhi")  # api key, api version, correlation id
MAX_FRAME = 256 * 1024 * 1024


@dataclass
class ProxyStats:
    connections: int = 0
    requests: int = 0
    responses: int = 0
    dropped: int = 0
    delayed: int = 0
    closed_by_fault: int = 0
    swallowed_bytes: int = 0
    requests_by_api: dict[int, int] = field(default_factory=dict)
    dropped_by_api: dict[int, int] = field(default_factory=dict)


@dataclass
class _Rule:
    api_keys: frozenset[int] | None  # None = every API

    def matches(self, api_key: int | None) -> bool:
        return self.api_keys is None or (api_key is not None and api_key in self.api_keys)


@dataclass
class _DropNext(_Rule):
    remaining: int = 0
    close: bool = False


@dataclass
class _DropEvery(_Rule):
    nth: int = 1
    close: bool = False
    seen: int = 0


@dataclass
class _Delay(_Rule):
    seconds: float = 0.0


class _Conn:
    def __init__(self, cid: int, client_w: asyncio.StreamWriter) -> None:
        self.cid = cid
        self.client_w = client_w
        self.upstream_w: asyncio.StreamWriter | None = None
        self.pending: dict[int, int] = {}  # correlation id -> api key
        self.tainted = False  # lost bytes in a blackhole
        self.tasks: list[asyncio.Task[None]] = []

    def close(self) -> None:
        for w in (self.client_w, self.upstream_w):
            if w is not None:
                with contextlib.suppress(Exception):
                    w.close()
        for t in self.tasks:
            t.cancel()


def _keys(api_keys: int | Iterable[int] | None) -> frozenset[int] | None:
    if api_keys is None:
        return None
    if isinstance(api_keys, int):
        return frozenset((api_keys,))
    return frozenset(api_keys)


class FaultProxy:
    """TCP proxy between Kafka clients and one broker, with injectable faults."""

    def __init__(self, upstream: tuple[str, int] | None = None, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port: int | None = None
        self._upstream = upstream
        self._lock = threading.Lock()
        self._drop_next: list[_DropNext] = []
        self._drop_every: list[_DropEvery] = []
        self._delays: list[_Delay] = []
        self._blackhole_until = 0.0
        self._conns: dict[int, _Conn] = {}
        self._next_cid = 0
        self.stats = ProxyStats()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None

    # ----------------------------------------------------------- lifecycle
    @property
    def bootstrap(self) -> str:
        if self.port is None:
            raise RuntimeError("proxy not started")
        return f"{self.host}:{self.port}"

    @property
    def advertised_listener(self) -> str:
        return f"PLAINTEXT://{self.bootstrap}"

    def set_upstream(self, host: str, port: int) -> None:
        """Where new connections go (e.g. after a broker restart on a new port)."""
        with self._lock:
            self._upstream = (host, port)

    def start(self) -> FaultProxy:
        """Bind the listening socket (port known at return) and start forwarding."""
        ready = threading.Event()
        error: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(
                    asyncio.start_server(self._handle, self.host, 0, reuse_address=True)
                )
                self.port = self._server.sockets[0].getsockname()[1]
            except BaseException as exc:
                error.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=run, name="fault-proxy", daemon=True)
        self._thread.start()
        ready.wait(10)
        if error:
            raise error[0]
        return self

    def close(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for conn in list(self._conns.values()):
                conn.close()
            self._conns.clear()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> FaultProxy:
        if self.port is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --------------------------------------------------------------- faults
    def drop_responses(
        self, n: int = 1, *, api_keys: int | Iterable[int] | None = None, close: bool = False
    ) -> None:
        with self._lock:
            self._drop_next.append(_DropNext(_keys(api_keys), remaining=n, close=close))

    def drop_every(
        self, nth: int, *, api_keys: int | Iterable[int] | None = None, close: bool = False
    ) -> None:
        if nth < 1:
            raise ValueError("nth must be >= 1")
        with self._lock:
            self._drop_every.append(_DropEvery(_keys(api_keys), nth=nth, close=close))

    def set_delay(self, seconds: float, *, api_keys: int | Iterable[int] | None = None) -> None:
        with self._lock:
            self._delays = [d for d in self._delays if d.api_keys != _keys(api_keys)]
            if seconds > 0:
                self._delays.append(_Delay(_keys(api_keys), seconds=seconds))

    def clear_faults(self) -> None:
        with self._lock:
            self._drop_next.clear()
            self._drop_every.clear()
            self._delays.clear()
            self._blackhole_until = 0.0

    def pending_drops(self) -> int:
        with self._lock:
            return sum(r.remaining for r in self._drop_next)

    def cut(self) -> int:
        """Close every current connection; returns how many were closed."""
        return self._call(self._cut_all)

    def blackhole(self, duration: float) -> None:
        """Swallow all traffic for ``duration`` seconds (returns at once)."""
        with self._lock:
            self._blackhole_until = time.monotonic() + duration
        loop = self._loop
        assert loop is not None
        loop.call_soon_threadsafe(loop.call_later, duration + 0.01, self._end_blackhole)

    # ------------------------------------------------------------ internals
    def _call(self, fn: object) -> int:
        loop = self._loop
        assert loop is not None, "proxy not started"

        async def run() -> int:
            return fn()  # type: ignore[operator,no-any-return]

        return asyncio.run_coroutine_threadsafe(run(), loop).result(10)

    def _cut_all(self) -> int:
        conns = list(self._conns.values())
        for conn in conns:
            conn.close()
        self._conns.clear()
        return len(conns)

    def _end_blackhole(self) -> None:
        with self._lock:
            if time.monotonic() < self._blackhole_until:
                return  # extended meanwhile; a later callback ends it
        for cid, conn in list(self._conns.items()):
            if conn.tainted:
                conn.close()
                self._conns.pop(cid, None)

    def _blackholed(self) -> bool:
        with self._lock:
            return time.monotonic() < self._blackhole_until

    def _decide(self, api_key: int | None) -> tuple[str, float]:
        """-> (action, delay) with action in pass/drop/drop_close."""
        with self._lock:
            for rule in self._drop_next:
                if rule.remaining > 0 and rule.matches(api_key):
                    rule.remaining -= 1
                    self._drop_next = [r for r in self._drop_next if r.remaining > 0]
                    return ("drop_close" if rule.close else "drop"), 0.0
            for every in self._drop_every:
                if every.matches(api_key):
                    every.seen += 1
                    if every.seen % every.nth == 0:
                        return ("drop_close" if every.close else "drop"), 0.0
            delay = max((d.seconds for d in self._delays if d.matches(api_key)), default=0.0)
            return "pass", delay

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self._next_cid += 1
        conn = _Conn(self._next_cid, client_w)
        self._conns[conn.cid] = conn
        self.stats.connections += 1
        with self._lock:
            upstream = self._upstream
        if upstream is None:
            conn.close()
            self._conns.pop(conn.cid, None)
            return
        try:
            up_r, up_w = await asyncio.open_connection(*upstream)
        except OSError:
            conn.close()
            self._conns.pop(conn.cid, None)
            return
        conn.upstream_w = up_w
        to_broker = asyncio.create_task(self._client_to_broker(conn, client_r, up_w))
        to_client = asyncio.create_task(self._broker_to_client(conn, up_r, client_w))
        conn.tasks = [to_broker, to_client]
        try:
            await asyncio.wait(conn.tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            conn.close()
            self._conns.pop(conn.cid, None)

    @staticmethod
    async def _read_frame(reader: asyncio.StreamReader) -> bytes | None:
        try:
            head = await reader.readexactly(4)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        (size,) = _SIZE.unpack(head)
        if size < 0 or size > MAX_FRAME:
            # Not a frame we can follow (e.g. a test's oversized-frame probe): pass it on raw.
            return head
        try:
            return head + await reader.readexactly(size)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None

    async def _client_to_broker(
        self, conn: _Conn, reader: asyncio.StreamReader, up_w: asyncio.StreamWriter
    ) -> None:
        while True:
            frame = await self._read_frame(reader)
            if frame is None:
                return
            if self._blackholed():
                conn.tainted = True
                self.stats.swallowed_bytes += len(frame)
                continue
            if len(frame) >= 12:
                api_key, _version, corr = _REQ_HEAD.unpack_from(frame, 4)
                conn.pending[corr] = api_key
                self.stats.requests += 1
                self.stats.requests_by_api[api_key] = self.stats.requests_by_api.get(api_key, 0) + 1
            up_w.write(frame)
            try:
                await up_w.drain()
            except ConnectionError:
                return

    async def _broker_to_client(
        self, conn: _Conn, reader: asyncio.StreamReader, client_w: asyncio.StreamWriter
    ) -> None:
        while True:
            frame = await self._read_frame(reader)
            if frame is None:
                return
            if self._blackholed():
                conn.tainted = True
                self.stats.swallowed_bytes += len(frame)
                continue
            api_key: int | None = None
            if len(frame) >= 8:
                (corr,) = _SIZE.unpack_from(frame, 4)
                api_key = conn.pending.pop(corr, None)
            self.stats.responses += 1
            action, delay = self._decide(api_key)
            if action != "pass":
                self.stats.dropped += 1
                if api_key is not None:
                    self.stats.dropped_by_api[api_key] = self.stats.dropped_by_api.get(api_key, 0) + 1
                if action == "drop_close":
                    self.stats.closed_by_fault += 1
                    return  # _handle closes both sides
                continue
            if delay > 0:
                self.stats.delayed += 1
                await asyncio.sleep(delay)
            client_w.write(frame)
            try:
                await client_w.drain()
            except ConnectionError:
                return


@dataclass
class ProxiedBroker:
    """A broker that advertises a fault proxy's address; clients bootstrap to the proxy."""

    broker: Broker
    proxy: FaultProxy

    @property
    def bootstrap(self) -> str:
        return self.proxy.bootstrap

    def restart(self, *, clean: bool = True) -> None:
        """Restart the broker on the same port (so the advertised proxy stays right)."""
        self.broker.restart(same_port=True, clean=clean)
        self.proxy.set_upstream(self.broker.host, self.broker.port or 0)
