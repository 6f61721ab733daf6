"""Answers written to a TLS connection in pieces arrive whole and in order, through a real TLS
server transport (uvloop's, as the broker runs) built from the broker's own server context, whose
SSL objects call OpenSSL directly (DirectSSLObject)."""

from __future__ import annotations

import asyncio
import os
import ssl
from pathlib import Path

import pytest
import uvloop
from tests.support.certs import TestPki, make_pki

from exactly.security.tls import DirectSSLObject, server_context
from exactly.server.tls_write import PIECE, pieces, write_tls
from exactly.storage.file_slice import FileSlice


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_pieces_regroup_chunks_without_changing_bytes_or_order() -> None:
    chunks = [b"h" * 10, os.urandom(3 * PIECE + 17), b"m" * 100, bytearray(os.urandom(PIECE)), b"t"]
    batches = list(pieces(chunks))
    sizes = [sum(len(c) for c in batch) for batch in batches]
    assert all(size == PIECE for size in sizes[:-1]) and 0 < sizes[-1] <= PIECE
    assert b"".join(bytes(c) for batch in batches for c in batch) == b"".join(chunks)


def test_small_answers_stay_one_batch() -> None:
    assert list(pieces([b"a", b"bc"])) == [[b"a", b"bc"]]
    assert list(pieces([])) == []


def test_a_file_slice_is_read_and_closed_and_a_cut_file_breaks_the_answer(tmp_path: Path) -> None:
    path = tmp_path / "segment.log"
    data = os.urandom(2 * PIECE)
    path.write_bytes(data)
    fd = os.open(path, os.O_RDWR)
    whole, cut = FileSlice(fd, 0, len(data)), FileSlice(fd, 0, len(data))
    assert b"".join(bytes(c) for batch in pieces([whole]) for c in batch) == data
    assert whole.fileno() == -1
    os.ftruncate(fd, 100)
    os.close(fd)
    with pytest.raises(ConnectionError):
        list(pieces([cut]))
    assert cut.fileno() == -1


class _Answering(asyncio.Protocol):
    """Writes ``answers`` once the handshake is done, one ``write_tls`` call each with a loop
    iteration in between, then closes; records which SSL object class the transport used."""

    def __init__(self, answers: list[list[bytes]], done: asyncio.Future[str]) -> None:
        self.answers = answers
        self.done = done

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        asyncio.get_running_loop().create_task(self._answer(transport))  # type: ignore[arg-type]

    async def _answer(self, transport: asyncio.Transport) -> None:
        for chunks in self.answers:
            write_tls(transport, chunks)
            await asyncio.sleep(0)
        self.done.set_result(type(transport.get_extra_info("ssl_object")).__name__)
        transport.close()


async def _round_trip(pki: TestPki, answers: list[list[bytes]]) -> tuple[bytes, str]:
    values = {"ssl.keystore.location": str(pki.server_keystore)}
    context = server_context(lambda key: values.get(key, ""), "none")
    loop = asyncio.get_running_loop()
    done: asyncio.Future[str] = loop.create_future()
    server = await loop.create_server(lambda: _Answering(answers, done), "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    client = ssl.create_default_context(cafile=str(pki.ca))
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
    received = await reader.read(-1)
    writer.close()
    server.close()
    return received, await done


def test_answers_arrive_whole_and_in_order_over_tls(pki: TestPki) -> None:
    first = [b"size", os.urandom(5000)]
    fetch = [b"header", os.urandom(PIECE * 8 + 12345), b"trailer", os.urandom(300)]
    small = [b"x" * 10]
    received, ssl_class = uvloop.run(_round_trip(pki, [first, fetch, small]))
    assert received == b"".join(first + fetch + small)
    assert ssl_class == DirectSSLObject.__name__


def test_direct_ssl_object_calls_openssl_directly(pki: TestPki) -> None:
    values = {"ssl.keystore.location": str(pki.server_keystore)}
    context = server_context(lambda key: values.get(key, ""), "none")
    server = context.wrap_bio(ssl.MemoryBIO(), ssl.MemoryBIO(), server_side=True)
    assert isinstance(server, DirectSSLObject)
    for name in ("read", "write", "pending"):  # the C methods, not ssl.SSLObject's forwarders
        assert type(getattr(server, name)).__name__ == "builtin_function_or_method"
    with pytest.raises(ssl.SSLWantReadError):  # no handshake yet: OpenSSL's own answer
        server.do_handshake()
