"""One client connection: frames in, responses out, strictly in request order.

Kafka processes a connection's requests one at a time (the socket is muted until the response is
sent), so pipelined requests (librdkafka keeps up to 5 in flight) are read ahead but handled and
answered in order. A long-polling Fetch therefore delays later requests on the same connection,
exactly as in Kafka; clients use separate connections where that matters.

What closes a connection (each with a log line, as Kafka does): a frame over
socket.request.max.bytes, an unparseable header, an unknown API key, a non-ApiVersions request
at a version we do not speak, a body the schema cannot parse. Everything else gets an error
code in a response. A failure inside a handler is logged and the connection closed; the broker
and its other connections are unaffected.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import VERSION_RANGES, ApiKey, ApiSchema, build, encode_response, schema
from exactly.protocol.framing import FrameDecoder, FrameError, frame
from exactly.protocol.header import (
    HeaderError,
    RequestHeader,
    parse_request_header,
    response_header,
    skip_tagged_fields,
)
from exactly.server.handlers import HANDLERS, PARSERS

if TYPE_CHECKING:
    from exactly.server.broker import Broker

log = logging.getLogger("exactly.connection")

READ_SIZE = 1 << 20


class CloseConnection(Exception):
    """Raised by the dispatcher when Kafka would close the connection."""


@dataclass(frozen=True, slots=True)
class RequestContext:
    header: RequestHeader
    api: ApiSchema
    peer: str

    @property
    def version(self) -> int:
        return self.header.api_version


async def serve_connection(
    broker: Broker, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    peername = writer.get_extra_info("peername")
    peer = f"{peername[0]}:{peername[1]}" if peername else "?"
    decoder = FrameDecoder(broker.max_request_size)
    try:
        while True:
            data = await reader.read(READ_SIZE)
            if not data:
                return
            try:
                frames = decoder.feed(data)
            except FrameError as exc:
                log.warning("closing connection from %s: %s", peer, exc)
                return
            for payload in frames:
                broker.metrics.bytes_in += len(payload) + 4
                try:
                    out = await dispatch(broker, payload, peer)
                except CloseConnection as exc:
                    log.warning("closing connection from %s: %s", peer, exc)
                    return
                if out is not None:
                    broker.metrics.bytes_out += len(out)
                    writer.write(out)
            if writer.transport.get_write_buffer_size() > (4 << 20):
                await writer.drain()
    except (ConnectionResetError, BrokenPipeError):
        return
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("unexpected error on connection from %s; closing it", peer)
    finally:
        writer.close()


def _api_versions_unsupported(header: RequestHeader) -> bytes:
    """Kafka answers an ApiVersions request of an unknown version with a v0 response carrying
    UNSUPPORTED_VERSION and the supported ranges, so the client can retry with one it knows."""
    api = schema(ApiKey.API_VERSIONS, 0)
    mod = api.response_module
    body = build(
        api.response_type,
        error_code=ErrorCode.unsupported_version,
        api_keys=tuple(
            build(mod.ApiVersion, api_key=k, min_version=lo, max_version=hi)
            for k, (lo, hi) in supported_apis()
        ),
    )
    return frame(response_header(header.correlation_id, False) + encode_response(api, body))


def supported_apis() -> list[tuple[int, tuple[int, int]]]:
    return [(int(k), VERSION_RANGES[k]) for k in sorted(HANDLERS) if k in VERSION_RANGES]


async def dispatch(broker: Broker, payload: bytes, peer: str) -> bytes | None:
    try:
        header, pos = parse_request_header(payload)
    except HeaderError as exc:
        raise CloseConnection(f"malformed request header: {exc}") from None
    key = header.api_key
    broker.metrics.requests[key] += 1
    handler = HANDLERS.get(key)
    if handler is None:
        raise CloseConnection(f"unknown or unsupported API key {key}")
    lo, hi = VERSION_RANGES[key]
    if not lo <= header.api_version <= hi:
        if key == ApiKey.API_VERSIONS:
            broker.metrics.error(key, ErrorCode.unsupported_version)
            return _api_versions_unsupported(header)
        raise CloseConnection(
            f"API {ApiKey(key).name} version {header.api_version} is not supported (supported {lo}-{hi})"
        )
    api = schema(key, header.api_version)
    try:
        if api.request_flexible:
            pos = skip_tagged_fields(payload, pos)
        parser = PARSERS.get(key)
        request: Any
        if parser is not None:
            request = parser(payload, pos, header.api_version)
        else:
            request, _size = api.read_request(payload, pos)
    except Exception as exc:  # any decode failure of client bytes
        raise CloseConnection(
            f"cannot parse {ApiKey(key).name} v{header.api_version} request: {type(exc).__name__}: {exc}"
        ) from None
    ctx = RequestContext(header, api, peer)
    response = await handler(broker, ctx, request)
    if response is None:  # acks=0 produce
        return None
    flexible = api.response_flexible and key != ApiKey.API_VERSIONS
    if isinstance(response, bytes | bytearray):  # hand-encoded body (hot paths)
        body = bytes(response)
    else:
        body = encode_response(api, response)
    return frame(response_header(header.correlation_id, flexible) + body)
