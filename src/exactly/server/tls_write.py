"""Writing responses to a TLS connection in pieces, so that encrypting and sending overlap.

Why: a TLS transport (uvloop's SSL protocol, like asyncio's) encrypts everything one ``write``
or ``writelines`` call hands it before it passes the ciphertext to the socket. A 1 MB Fetch
answer written in one call is therefore encrypted whole before its first byte leaves, and the
consumer, which sends its next Fetch only once this answer is in, starts decrypting only after
that: broker and client take turns instead of working at the same time. Handed over PIECE
bytes per call, each piece is encrypted and written to the socket (uvloop writes at once while
the socket takes the bytes) before the next piece is encrypted, so the client decrypts piece n
while the broker encrypts piece n + 1.

Nothing else changes: the same bytes in the same order, with no extra copy (pieces of a large
chunk are memoryview slices, encrypted by the transport within the call that gets them, so no
view outlives its call). Small chunks (headers, small answers) are gathered until PIECE is
reached, as one ``writelines`` gathers them for a plaintext connection. A ``FileSlice`` (the
plaintext path's sendfile chunk) is not handed to TLS connections by the dispatcher; should one
arrive it is read and written like any other chunk, never sent around the encryption.

TLS records stay OpenSSL's: a piece is a multiple of the 16 KB maximum record, so pieces add no
short records except at the end of an answer."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

from exactly.storage.file_slice import FileSlice

PIECE = 128 * 1024  # bytes per transport call: 8 full TLS records


def pieces(chunks: list[Any]) -> Iterator[list[Any]]:
    """``chunks`` (bytes-like, in order) regrouped into lists of PIECE bytes (the last one may
    be shorter); a large chunk is cut into memoryview slices."""
    batch: list[Any] = []
    size = 0
    for chunk in chunks:
        if type(chunk) is FileSlice:
            chunk = _read_slice(chunk)
        n = len(chunk)
        if size + n < PIECE:
            batch.append(chunk)
            size += n
            continue
        view = memoryview(chunk)
        start = 0
        while start < n:
            take = min(PIECE - size, n - start)
            batch.append(chunk if take == n else view[start : start + take])
            size += take
            start += take
            if size >= PIECE:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch


def write_tls(transport: asyncio.Transport, chunks: list[Any]) -> None:
    """``chunks`` to a TLS transport, a ``writelines`` call per piece."""
    for batch in pieces(chunks):
        transport.writelines(batch)


def _read_slice(piece: FileSlice) -> bytes:
    try:
        data = piece.read()
    finally:
        piece.close()
    if len(data) != piece.size:
        raise ConnectionError("a segment file was truncated under a Fetch answer being sent")
    return data
