"""The fault proxy itself, against a tiny in-process frame-echo server (no broker needed):
the fault tests are only as good as their faults."""

from __future__ import annotations

import socket
import socketserver
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support.proxy import FaultProxy
from tests.support.wire import ConnectionClosed, WireClient, raw_request

pytestmark = pytest.mark.timeout(30)


class _Echo(socketserver.BaseRequestHandler):
    """Answers every request frame with a response frame: correlation id + b"ok" + api key."""

    def handle(self) -> None:
        sock: socket.socket = self.request
        buf = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while len(buf) >= 4:
                (size,) = struct.unpack_from(">i", buf)
                if len(buf) < 4 + size:
                    break
                frame, buf = buf[4 : 4 + size], buf[4 + size :]
                api_key, _version, corr = struct.unpack_from(">hhi", frame)
                body = struct.pack(">i", corr) + b"ok" + struct.pack(">h", api_key)
                sock.sendall(struct.pack(">i", len(body)) + body)


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    p = FaultProxy(upstream=("127.0.0.1", server.server_address[1])).start()
    try:
        yield p
    finally:
        p.close()
        server.shutdown()
        server.server_close()


def _ask(c: WireClient, api_key: int = 0) -> int:
    corr = c.next_correlation_id()
    c.send_frame(raw_request(api_key, 0, corr))
    payload = c.recv_frame()
    (got,) = struct.unpack_from(">i", payload)
    return int(got)


def test_pass_through(proxy: FaultProxy) -> None:
    with WireClient(proxy.bootstrap) as c:
        assert [_ask(c) for _ in range(5)] == [1, 2, 3, 4, 5]
    assert proxy.stats.requests == 5 and proxy.stats.responses == 5


def test_drop_next_responses_of_one_api_keeps_connection(proxy: FaultProxy) -> None:
    proxy.drop_responses(2, api_keys=0)
    with WireClient(proxy.bootstrap, timeout=2) as c:
        assert _ask(c, api_key=3) == 1  # other APIs pass
        c.send_frame(raw_request(0, 0, 2))
        c.send_frame(raw_request(0, 0, 3))
        c.send_frame(raw_request(0, 0, 4))
        c._correlation = 4
        (got,) = struct.unpack_from(">i", c.recv_frame())
        assert got == 4  # 2 and 3 were swallowed, the connection lives on
    assert proxy.stats.dropped_by_api == {0: 2}


def test_drop_and_close(proxy: FaultProxy) -> None:
    proxy.drop_responses(1, close=True)
    with WireClient(proxy.bootstrap, timeout=2) as c:
        c.send_frame(raw_request(0, 0, 1))
        with pytest.raises(ConnectionClosed):
            c.recv_frame()
    with WireClient(proxy.bootstrap, timeout=2) as c:
        assert _ask(c) == 1
    assert proxy.stats.closed_by_fault == 1


def test_drop_every_nth(proxy: FaultProxy) -> None:
    proxy.drop_every(3, close=True)
    answered = 0
    for _ in range(3):
        with WireClient(proxy.bootstrap, timeout=2) as c:
            try:
                while True:
                    _ask(c)
                    answered += 1
            except ConnectionClosed:
                pass
    assert answered == 6
    assert proxy.stats.dropped == 3


def test_delay(proxy: FaultProxy) -> None:
    proxy.set_delay(0.3)
    with WireClient(proxy.bootstrap) as c:
        start = time.monotonic()
        _ask(c)
        assert time.monotonic() - start >= 0.28
    proxy.set_delay(0)
    with WireClient(proxy.bootstrap) as c:
        start = time.monotonic()
        _ask(c)
        assert time.monotonic() - start < 0.25


def test_cut_and_blackhole(proxy: FaultProxy) -> None:
    with WireClient(proxy.bootstrap, timeout=2) as c:
        assert _ask(c) == 1
        assert proxy.cut() == 1
        assert c.is_closed(2)
    with WireClient(proxy.bootstrap, timeout=3) as c:
        proxy.blackhole(0.5)
        c.send_frame(raw_request(0, 0, 1))
        assert c.is_closed(3)  # swallowed, then closed when the blackhole ends
    with WireClient(proxy.bootstrap, timeout=2) as c:
        assert _ask(c) == 1
