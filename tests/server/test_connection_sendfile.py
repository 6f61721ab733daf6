"""A Fetch answer's records as a FileSlice go out through a real socket between the chunks before
and after them, in order: with sendfile as far as the socket takes them, the rest copied through
the transport (a socket whose peer does not read yet takes only its buffer's worth)."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

from exactly.server.plain_write import write_plain as _write
from exactly.storage.file_slice import FileSlice


def _file(tmp_path: Path, data: bytes) -> int:
    path = tmp_path / "segment.log"
    path.write_bytes(data)
    return os.open(path, os.O_RDWR)


async def _send_and_receive(chunks: list[object], expected: int) -> bytes:
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)  # far below the slice
    transport, _protocol = await loop.create_connection(asyncio.Protocol, sock=ours)
    try:
        _write(transport, chunks)  # type: ignore[arg-type]
        theirs.setblocking(False)
        received = bytearray()
        while len(received) < expected:
            try:
                chunk = await loop.sock_recv(theirs, 1 << 20)
            except BlockingIOError:
                continue
            if not chunk:
                break
            received += chunk
        return bytes(received)
    finally:
        transport.close()
        theirs.close()


@pytest.mark.parametrize("size", [1000, 3_000_000])
def test_a_slice_is_sent_between_its_neighbours(tmp_path: Path, size: int) -> None:
    data = os.urandom(size + 500)
    fd = _file(tmp_path, data)
    piece = FileSlice(fd, 200, size)
    os.close(fd)  # the slice keeps its own descriptor
    got = asyncio.run(_send_and_receive([b"head", piece, b"tail"], size + 8))
    assert got == b"head" + data[200 : 200 + size] + b"tail"
    assert piece.fileno() == -1  # closed once written


def test_a_file_cut_under_its_slice_breaks_the_answer(tmp_path: Path) -> None:
    fd = _file(tmp_path, os.urandom(10_000))
    piece = FileSlice(fd, 0, 10_000)
    os.ftruncate(fd, 4_000)
    os.close(fd)

    async def main() -> None:
        with pytest.raises(ConnectionError):
            await _send_and_receive([piece], 10_000)

    asyncio.run(main())
    assert piece.fileno() == -1


async def _over_tcp(chunks: list[object], expected: int) -> tuple[bytes, int]:
    """Write ``chunks`` on a loopback TCP connection; what the peer got and TCP_CORK afterwards."""
    loop = asyncio.get_running_loop()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    client = socket.create_connection(listener.getsockname())
    peer, _ = await loop.sock_accept(listener)
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    transport, _protocol = await loop.create_connection(asyncio.Protocol, sock=client)
    try:
        _write(transport, chunks)  # type: ignore[arg-type]
        cork = client.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK)
        received = bytearray()
        while len(received) < expected:
            chunk = await asyncio.wait_for(loop.sock_recv(peer, 1 << 20), 10)
            if not chunk:
                break
            received += chunk
        return bytes(received), cork
    finally:
        transport.close()
        peer.close()
        listener.close()


@pytest.mark.skipif(not hasattr(socket, "TCP_CORK"), reason="TCP_CORK is Linux's")
def test_an_answer_with_a_slice_leaves_uncorked_over_tcp(tmp_path: Path) -> None:
    """The answer is written corked (so it leaves as full segments), and the cork is off again
    once written: the last bytes are pushed at once, not held for the cork's 200 ms."""
    size = 2_000_000
    data = os.urandom(size)
    fd = _file(tmp_path, data)
    piece = FileSlice(fd, 0, size)
    os.close(fd)
    got, cork = asyncio.run(_over_tcp([b"head", piece, b"end"], size + 7))
    assert got == b"head" + data + b"end"
    assert cork == 0
    assert piece.fileno() == -1
