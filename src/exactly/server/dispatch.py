"""Request dispatch: one request frame in, its response chunks out (or a reason to close).

The connection (exactly.server.connection) hands every whole frame to ``dispatch``, one at a
time in arrival order. Dispatch parses the request header, checks the API and version against
the supported-API table (exactly.protocol.apis, the same table ApiVersions advertises), parses
the body (a handler's own hand-written parser for the hot APIs, kio for the rest, behind the
guard against array lengths that would make kio's native reader abort the process), calls the
handler and frames its response. It holds no state of its own; what it touches is the broker's.

What Kafka answers by closing the connection raises CloseConnection (the connection logs the
reason and closes): an unparseable header, an unknown API key, a non-ApiVersions request at a
version we do not speak, a body the schema cannot parse. An ApiVersions request of an unknown
version is answered with a v0 response carrying UNSUPPORTED_VERSION and the supported ranges.
Everything else gets an error code inside a response, chosen by the handler.

A caller that passes ``may_defer=True`` (the connection) may get a ``Deferred`` instead of chunks:
the request's effects are done and its framed answer comes when ``Deferred.answer`` finishes (an
acks=all produce waiting for the ISR; ``exactly.server.deferred_response``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.frozen import quick_init
from exactly.protocol.apis import (
    VERSION_RANGES,
    ApiKey,
    ApiSchema,
    build,
    encode_response,
    schema,
    supported_apis,
)
from exactly.protocol.framing import frame
from exactly.protocol.guard import overlong_array, without_unknown_tags
from exactly.protocol.header import (
    HeaderError,
    RequestHeader,
    parse_request_header,
    response_header,
    skip_tagged_fields,
)
from exactly.server.clock import now_ms
from exactly.server.deferred_response import Deferred, PendingAnswer
from exactly.server.handlers import HANDLERS, PARSERS

if TYPE_CHECKING:
    from exactly.server.broker import Broker

_SIZE = struct.Struct(">i")
# size + response header v0 (correlation id) or v1 (+ an empty tag section), in one pack
_SIZE_HEAD_V0 = struct.Struct(">ii")
_SIZE_HEAD_V1 = struct.Struct(">iiB")
_BYTES = (bytes, bytearray)
# per-request constants: an enum member lookup costs a dict walk in Python 3.11
_API_VERSIONS = int(ApiKey.API_VERSIONS)
_PRODUCE = int(ApiKey.PRODUCE)
_FETCH = int(ApiKey.FETCH)


class CloseConnection(Exception):
    """Raised by the dispatcher when Kafka would close the connection; the message is the reason
    the connection logs."""


def _nothing() -> None:
    """The default ``before_park``: nothing held back."""


@quick_init
@dataclass(frozen=True, slots=True)
class RequestContext:
    """What a handler knows about its request besides the body: the parsed header, the schema of
    the request's (api, version), the peer address (for log lines), and ``before_park``: what a
    handler that is about to wait (an acks=all produce parked for the ISR) calls first, so the
    connection can send the responses it holds back for a combined write (no-op by default);
    ``may_defer``: the caller takes a ``Deferred`` answer (the connection does, other callers
    such as the fuzz harness get the awaited one); ``file_slices``: the caller writes a storage
    ``FileSlice`` chunk itself (the connection, with sendfile), so a Fetch may answer with one;
    ``principal``: who sent the request, as authorization sees it (``User:ANONYMOUS``,
    ``User:<SASL user>`` or a client certificate's mapped name; exactly.server.authz);
    ``listener``: the name of the listener it came in on (Metadata and FindCoordinator answer
    with that listener's endpoints)."""

    header: RequestHeader
    api: ApiSchema
    peer: str
    before_park: Callable[[], None] = _nothing
    may_defer: bool = False
    file_slices: bool = False
    principal: str = "User:ANONYMOUS"
    listener: str = "PLAINTEXT"

    @property
    def version(self) -> int:
        return self.header.api_version


def _api_versions_unsupported(header: RequestHeader) -> list[bytes]:
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
    return [frame(response_header(header.correlation_id, False) + encode_response(api, body))]


def _read_kio(api: Any, payload: bytearray, pos: int) -> Any:
    """Parse a request body with kio, skipping tagged fields its schema does not know (Kafka
    skips them; kio raises KeyError). kio's native reader refuses writable buffers, hence the
    copy; these are the small, rare requests."""
    try:
        request, _size = api.read_request(bytes(payload), pos)
    except KeyError:
        stripped = without_unknown_tags(api.request_type, payload, pos)
        if stripped is None:
            raise
        request, _size = api.read_request(stripped, 0)
    return request


def fast_answer(
    broker: Broker, payload: bytearray, may_defer: bool, file_slices: bool
) -> list[Any] | Deferred[list[Any] | None] | None:
    """The answer of a request the fast paths take whole, without a coroutine (the connection
    calls it from its read callback and its request task, then ``dispatch(...,
    fast_paths=False)`` when it declines); None: not one of theirs, nothing changed, the generic
    path of ``dispatch`` answers it. The common single-broker Produce (server.produce_fast) and
    the common consumer Fetch, parked without a task when it waits (server.fetch_fast, only for
    a caller that takes a deferred answer), and on a cluster broker a follower's steady-state Fetch
    (server.follower_fetch_fast)."""
    if len(payload) > 32 and not payload[0]:
        key = payload[1]
        if key == _PRODUCE:
            if broker.replicas is not None:  # a Produce at a cluster leader (produce_fast_cluster)
                return broker.cluster_produce.answer(payload, now_ms(), may_defer)
            return broker.fast_produce.answer(payload, now_ms())
        if key == _FETCH and may_defer:
            if broker.replicas is not None:  # a follower's Fetch at its leader (follower_fetch_fast)
                return broker.follower_fetch.answer(payload, file_slices)
            return broker.fast_fetch.answer(payload, file_slices)
    return None


async def dispatch(
    broker: Broker,
    payload: bytearray,
    peer: str,
    before_park: Callable[[], None] = _nothing,
    may_defer: bool = False,
    file_slices: bool = False,
    principal: str = "User:ANONYMOUS",
    listener: str = "PLAINTEXT",
    *,
    fast_paths: bool = True,
) -> list[Any] | Deferred[list[Any] | None] | None:
    """Handle one request frame; returns the response as chunks for ``writelines`` (None: no
    response), or with ``may_defer`` a ``Deferred`` of them. Raises CloseConnection where Kafka
    closes the connection. ``principal`` is the connection's authenticated principal; nothing
    in the request itself can change it. The fast paths first (``fast_answer``), then the
    generic path. ``fast_paths=False``: the generic path only, for a frame ``fast_answer``
    declined (the connection's request task calls ``fast_answer`` itself, as a plain call
    without a coroutine, and this only when it declines)."""
    if fast_paths:
        fast = fast_answer(broker, payload, may_defer, file_slices)
        if fast is not None:
            return fast
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
        if api.request_flexible:  # an empty tag section (one zero byte) is the usual case
            pos = pos + 1 if pos < len(payload) and payload[pos] == 0 else skip_tagged_fields(payload, pos)
        parser = PARSERS.get(key)
        request: Any
        if parser is not None:
            request = parser(payload, pos, header.api_version)
        else:
            overlong = overlong_array(api.request_type, payload, pos)
            if overlong is not None:  # kio would reserve memory for it and abort the process
                raise ValueError(f"malformed request: {overlong}")
            request = _read_kio(api, payload, pos)
    except Exception as exc:  # any decode failure of client bytes
        raise CloseConnection(
            f"cannot parse {ApiKey(key).name} v{header.api_version} request: {type(exc).__name__}: {exc}"
        ) from None
    ctx = RequestContext(
        header, api, peer, before_park, may_defer, file_slices, principal=principal, listener=listener
    )
    response = await handler(broker, ctx, request)
    if isinstance(response, Deferred):
        answer = response.answer
        if isinstance(answer, PendingAnswer):  # resolved by a call: framed in that call
            return Deferred(answer.then(partial(_frame_response, broker, api, header)))
        return Deferred(_frame_when_answered(broker, api, header, answer))
    return _frame_response(broker, api, header, response)


async def _frame_when_answered(
    broker: Broker, api: ApiSchema, header: RequestHeader, answer: Coroutine[Any, Any, Any]
) -> list[Any] | None:
    return _frame_response(broker, api, header, await answer)


def _frame_response(broker: Broker, api: ApiSchema, header: RequestHeader, response: Any) -> list[Any] | None:
    key = header.api_key
    if response is None:  # acks=0 produce
        return None
    # the frame's size and the response header (what ``response_header`` writes) in one pack
    flexible = api.response_flexible and key != _API_VERSIONS
    if isinstance(response, list):  # hand-encoded chunks (fetch)
        body = None
        size = (5 if flexible else 4) + sum(len(c) for c in response)
    else:
        body = response if isinstance(response, _BYTES) else encode_response(api, response)
        size = (5 if flexible else 4) + len(body)
    broker.metrics.bytes_out += size + 4
    if flexible:
        framed = _SIZE_HEAD_V1.pack(size, header.correlation_id, 0)
    else:
        framed = _SIZE_HEAD_V0.pack(size, header.correlation_id)
    return [framed, *response] if body is None else [framed, body]
