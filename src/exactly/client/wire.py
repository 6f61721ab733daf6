"""A small synchronous Kafka wire client for the command line tools, built on kio.

What librdkafka's AdminClient cannot do (KIP-664's DescribeProducers, DescribeTransactions,
ListTransactions, and WriteTxnMarkers for aborting a hanging transaction) the CLI sends itself:

    with WireClient.connect("127.0.0.1:9092", timeout=10) as client:
        version = client.version_for(ApiKey.LIST_TRANSACTIONS)
        response = client.call(ApiKey.LIST_TRANSACTIONS, version, state_filters=("Ongoing",))

Framing: a request is ``int32 size | request header | body``; the header is v1 for non-flexible
request versions and v2 (with a tagged-field buffer) for flexible ones. The response header is v0
for non-flexible responses and v1 for flexible ones, except ApiVersions whose response header is
always v0 (so a client can parse it whatever version it asked for).

``connect`` negotiates versions with ApiVersions (v3, falling back to v0 when the broker answers
UNSUPPORTED_VERSION); ``version_for`` then picks the highest version both sides know.

Security: ``connect(..., config=CONF)`` takes a Kafka client configuration with librdkafka's names
(``security.protocol``, ``ssl.*``, ``sasl.*``: :mod:`exactly.client.security`), the same dict the
CLI gives confluent-kafka. SSL/SASL_SSL wrap the socket in TLS first; SASL_PLAINTEXT/SASL_SSL then
authenticate as librdkafka does: ApiVersions, SaslHandshake v1 (the mechanism), and the tokens in
SaslAuthenticate (v2 or lower, as the broker offers). A refused login is an
:class:`AuthenticationError` carrying the broker's (generic) message.

Every failure is a :class:`WireError` with a one-line message: unreachable broker, closed
connection, timeout, an API the broker does not offer.
"""

from __future__ import annotations

import dataclasses
import io
import socket
import ssl
import struct
from collections.abc import Callable, Mapping
from functools import cache
from types import ModuleType
from typing import Any

from kio.index import KioIndexError, load_payload_module
from kio.schema.errors import ErrorCode
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

from exactly.client.security import ClientConfigError, ClientSecurity
from exactly.protocol.apis import ApiKey, build
from exactly.protocol.primitives import Reader
from exactly.security.scram import ScramError

__all__ = [
    "ApiKey",
    "AuthenticationError",
    "WireClient",
    "WireError",
    "error_name",
    "parse_bootstrap",
]

API_VERSIONS = int(ApiKey.API_VERSIONS)
_SIZE = struct.Struct(">i")
_MAX_RESPONSE = 512 * 1024 * 1024
_UNSUPPORTED_VERSION = 35
_SASL_HANDSHAKE_VERSION = 1  # v0 sends the tokens unframed; v1 wraps them in SaslAuthenticate
_SASL_AUTHENTICATE_MAX_VERSION = 2


class WireError(Exception):
    """A connection or protocol failure, with a one-line message for the user."""


class AuthenticationError(WireError):
    """The broker refused the credentials (SASL_AUTHENTICATION_FAILED), or the TLS handshake
    failed (an untrusted broker certificate, a refused client certificate)."""


def error_name(code: int) -> str:
    """Kafka's upper-case name of an error code (``CONCURRENT_TRANSACTIONS``), or the number."""
    try:
        return ErrorCode(int(code)).name.upper()
    except ValueError:
        return str(int(code))


def parse_bootstrap(text: str) -> list[tuple[str, int]]:
    """``host:port[,host:port...]`` -> addresses; raises WireError on a malformed entry."""
    out: list[tuple[str, int]] = []
    for part in text.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise WireError(f"invalid bootstrap address {part.strip()!r} (expected HOST:PORT)")
        out.append((host.strip("[]"), int(port)))
    return out


# ---------------------------------------------------------------------- schemas
def _entity_class(module: ModuleType, kind: EntityType) -> type[Any]:
    for value in vars(module).values():
        if isinstance(value, type) and getattr(value, "__type__", None) == kind:
            return value
    raise LookupError(f"no {kind.name} class in {module.__name__}")


@dataclasses.dataclass(frozen=True, slots=True)
class _Codec:
    request_module: ModuleType
    response_module: ModuleType
    request_type: type[Any]
    response_type: type[Any]
    write_request: Callable[[io.BytesIO, Any], None]
    read_response: Callable[[bytes, int], tuple[Any, int]]
    request_flexible: bool
    response_header_v1: bool


@cache
def _codec(api_key: int, version: int) -> _Codec:
    try:
        req_mod = load_payload_module(api_key, version, EntityType.request)
        resp_mod = load_payload_module(api_key, version, EntityType.response)
    except (KioIndexError, ModuleNotFoundError, LookupError) as exc:
        raise WireError(f"no schema for API {_api_name(api_key)} v{version}") from exc
    req_type = _entity_class(req_mod, EntityType.request)
    resp_type = _entity_class(resp_mod, EntityType.response)
    return _Codec(
        request_module=req_mod,
        response_module=resp_mod,
        request_type=req_type,
        response_type=resp_type,
        write_request=entity_writer(req_type),
        read_response=entity_reader(resp_type),
        request_flexible=bool(req_type.__flexible__),
        response_header_v1=bool(resp_type.__flexible__) and api_key != API_VERSIONS,
    )


@cache
def _known_versions(api_key: int) -> frozenset[int]:
    """The versions of ``api_key`` kio has schemas for."""
    found: set[int] = set()
    for version in range(0, 32):
        try:
            load_payload_module(api_key, version, EntityType.request)
        except (KioIndexError, ModuleNotFoundError, LookupError):
            continue
        found.add(version)
    return frozenset(found)


def _api_name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name
    except ValueError:
        return f"api {api_key}"


def encode_request(request: Any, correlation_id: int, client_id: str | None) -> bytes:
    """Request header (v1 or v2) + body, with the int32 size prefix."""
    codec = _codec(int(request.__api_key__), int(request.__version__))
    header_cls: Any = RequestHeaderV2 if codec.request_flexible else RequestHeaderV1
    header = header_cls(
        request_api_key=int(request.__api_key__),
        request_api_version=int(request.__version__),
        correlation_id=correlation_id,
        client_id=client_id,
    )
    buf = io.BytesIO()
    buf.write(b"\0\0\0\0")
    entity_writer(header_cls)(buf, header)
    codec.write_request(buf, request)
    data = bytearray(buf.getvalue())
    data[:4] = _SIZE.pack(len(data) - 4)
    return bytes(data)


def decode_response(api_key: int, version: int, payload: bytes) -> tuple[int, Any]:
    """-> (correlation id, response entity) from a response frame (without the size prefix)."""
    codec = _codec(api_key, version)
    header_cls: Any = ResponseHeaderV1 if codec.response_header_v1 else ResponseHeaderV0
    header, used = entity_reader(header_cls)(payload, 0)
    custom = _CUSTOM_READERS.get((api_key, version))
    if custom is not None:
        return int(header.correlation_id), custom(payload, used)
    body, _ = codec.read_response(payload, used)
    return int(header.correlation_id), body


# ---------------------------------------------------------------------- hand-written readers
@dataclasses.dataclass(frozen=True, slots=True)
class DescribedTopic:
    topic: str
    partitions: tuple[int, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class DescribedTransactionState:
    """One DescribeTransactions entry. Times stay in milliseconds: Kafka sends -1 as the start
    time of an id with no transaction, which kio's datetime reader refuses."""

    error_code: int
    transactional_id: str
    transaction_state: str
    transaction_timeout_ms: int
    transaction_start_time_ms: int
    producer_id: int
    producer_epoch: int
    topics: tuple[DescribedTopic, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class DescribeTransactionsResult:
    throttle_time_ms: int
    transaction_states: tuple[DescribedTransactionState, ...]


def _read_describe_transactions_v0(data: bytes, pos: int) -> DescribeTransactionsResult:
    r = Reader(data, pos)
    throttle = r.int32()
    states: list[DescribedTransactionState] = []
    for _ in range(max(r.array_length(True), 0)):
        error = r.int16()
        tid = r.nullable_string(True) or ""
        state = r.nullable_string(True) or ""
        timeout_ms = r.int32()
        start_ms = r.int64()
        producer_id = r.int64()
        producer_epoch = r.int16()
        topics: list[DescribedTopic] = []
        for _ in range(max(r.array_length(True), 0)):
            topic = r.nullable_string(True) or ""
            partitions = tuple(r.int32() for _ in range(max(r.array_length(True), 0)))
            r.skip_tagged_fields()
            topics.append(DescribedTopic(topic, partitions))
        r.skip_tagged_fields()
        states.append(
            DescribedTransactionState(
                error, tid, state, timeout_ms, start_ms, producer_id, producer_epoch, tuple(topics)
            )
        )
    r.skip_tagged_fields()
    return DescribeTransactionsResult(throttle, tuple(states))


_CUSTOM_READERS: dict[tuple[int, int], Callable[[bytes, int], Any]] = {
    (int(ApiKey.DESCRIBE_TRANSACTIONS), 0): _read_describe_transactions_v0,
}


# ---------------------------------------------------------------------- client
class WireClient:
    """One blocking TCP connection to a broker. Not thread-safe; one request at a time."""

    def __init__(
        self,
        sock: socket.socket,
        address: str,
        client_id: str | None = "exactly-cli",
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.sock = sock
        self.address = address
        self.client_id = client_id
        #: the client configuration it was opened with (a pool opens its other brokers alike)
        self.config: dict[str, Any] = dict(config or {})
        self.api_versions: dict[int, tuple[int, int]] = {}
        self._correlation = 0

    @classmethod
    def connect(
        cls,
        bootstrap: str,
        *,
        timeout: float = 30.0,
        client_id: str | None = "exactly-cli",
        config: Mapping[str, Any] | None = None,
    ) -> WireClient:
        """Connect to the first reachable bootstrap address, set up TLS and SASL as ``config``
        says, and negotiate API versions. Authentication failures are not retried on the next
        address (the credentials are the same there)."""
        try:
            security = ClientSecurity.from_config(config)
            context = security.ssl_context() if security.uses_tls else None
        except ClientConfigError as exc:
            raise WireError(str(exc)) from None
        last: str = "no address"
        for host, port in parse_bootstrap(bootstrap):
            address = f"{host}:{port}"
            try:
                sock = socket.create_connection((host, port), timeout=timeout)
            except TimeoutError:
                last = f"{address}: connection timed out"
                continue
            except OSError as exc:
                last = f"{address}: {exc.strerror or exc}"
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if context is not None:
                sock = _tls_handshake(context, sock, host, address)
            client = cls(sock, address, client_id, config)
            try:
                client._negotiate()
                if security.uses_sasl:
                    client._authenticate(security)
            except WireError:
                client.close()
                raise
            return client
        raise WireError(f"cannot connect to the broker ({last})")

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ versions
    def _negotiate(self) -> None:
        response = self.call(
            API_VERSIONS, 3, client_software_name="exactly-cli", client_software_version="0.1.0"
        )
        if int(response.error_code) == _UNSUPPORTED_VERSION:
            response = self.call(API_VERSIONS, 0)
        if int(response.error_code):
            raise WireError(f"ApiVersions failed: {error_name(response.error_code)}")
        self.api_versions = {
            int(a.api_key): (int(a.min_version), int(a.max_version)) for a in response.api_keys
        }

    def _authenticate(self, security: ClientSecurity) -> None:
        """SaslHandshake v1, then the mechanism's tokens in SaslAuthenticate requests."""
        mechanism = security.sasl_mechanism or ""
        handshake = self.call(ApiKey.SASL_HANDSHAKE, _SASL_HANDSHAKE_VERSION, mechanism=mechanism)
        if int(handshake.error_code):
            offered = ", ".join(str(m) for m in handshake.mechanisms) or "none"
            raise AuthenticationError(
                f"the broker at {self.address} does not offer SASL mechanism {mechanism} "
                f"({error_name(handshake.error_code)}; enabled: {offered})"
            )
        version = self.version_for(ApiKey.SASL_AUTHENTICATE, _SASL_AUTHENTICATE_MAX_VERSION)
        session = security.sasl_session()
        token: bytes | None = session.first()
        who = f"user '{security.sasl_username}' ({mechanism}) at {self.address}"
        while token is not None:
            response = self.call(ApiKey.SASL_AUTHENTICATE, version, auth_bytes=token)
            if int(response.error_code):
                message = response.error_message or error_name(response.error_code)
                raise AuthenticationError(f"authentication failed for {who}: {message}")
            try:
                token = session.respond(bytes(response.auth_bytes))
            except ScramError as exc:
                raise AuthenticationError(f"authentication failed for {who}: {exc}") from None

    def version_for(self, api_key: int, max_version: int | None = None) -> int:
        """The highest version of ``api_key`` the broker supports, kio knows and <= max_version."""
        supported = self.api_versions.get(int(api_key))
        if supported is None:
            raise WireError(f"the broker at {self.address} does not support {_api_name(api_key)}")
        lo, hi = supported
        if max_version is not None:
            hi = min(hi, max_version)
        for version in range(hi, lo - 1, -1):
            if version in _known_versions(int(api_key)):
                return version
        raise WireError(
            f"no common version of {_api_name(api_key)} (broker supports {supported[0]}-{supported[1]})"
        )

    # ------------------------------------------------------------------ requests
    def module(self, api_key: int, version: int) -> ModuleType:
        """The kio request module of ``api_key`` v``version`` (to build nested entities)."""
        return _codec(int(api_key), version).request_module

    def request(self, api_key: int, version: int, **fields: Any) -> Any:
        """A request entity of that version from the fields it has (others: defaults/zero)."""
        return build(_codec(int(api_key), version).request_type, **fields)

    def call(self, api_key: int, version: int, **fields: Any) -> Any:
        """Build, send and await one request; returns the response entity."""
        return self.send(self.request(api_key, version, **fields))

    def send(self, request: Any) -> Any:
        api_key = int(request.__api_key__)
        version = int(request.__version__)
        self._correlation += 1
        correlation = self._correlation
        name = f"{_api_name(api_key)} v{version}"
        try:
            self.sock.sendall(encode_request(request, correlation, self.client_id))
            payload = self._recv_frame()
        except TimeoutError:
            raise WireError(f"{name}: no answer from {self.address} in time") from None
        except OSError as exc:
            raise WireError(f"{name}: connection to {self.address} failed: {exc.strerror or exc}") from None
        try:
            got, body = decode_response(api_key, version, payload)
        except WireError:
            raise
        except Exception as exc:
            raise WireError(f"{name}: cannot parse the response: {type(exc).__name__}: {exc}") from None
        if got != correlation:
            raise WireError(f"{name}: response has correlation id {got}, expected {correlation}")
        return body

    def _recv_exact(self, n: int) -> bytes:
        # an SSLSocket's recv raises SSLError (an OSError) on a broken TLS stream: send() maps it
        chunks = bytearray()
        while len(chunks) < n:
            chunk = self.sock.recv(min(n - len(chunks), 1 << 20))
            if not chunk:
                raise WireError(f"the broker at {self.address} closed the connection")
            chunks += chunk
        return bytes(chunks)

    def _recv_frame(self) -> bytes:
        (size,) = _SIZE.unpack(self._recv_exact(4))
        if not 0 <= size <= _MAX_RESPONSE:
            raise WireError(f"bad response size {size} from {self.address}")
        return self._recv_exact(size)


def _tls_handshake(context: ssl.SSLContext, sock: socket.socket, host: str, address: str) -> socket.socket:
    """Wrap ``sock`` in TLS (the server name is the address's host, checked against the
    certificate unless ``ssl.endpoint.identification.algorithm=none``)."""
    try:
        return context.wrap_socket(sock, server_hostname=host)
    except ssl.SSLCertVerificationError as exc:
        sock.close()
        raise AuthenticationError(
            f"TLS handshake with {address} failed: the broker's certificate is not trusted ({exc.verify_message})"
        ) from None
    except ssl.SSLError as exc:
        sock.close()
        raise AuthenticationError(f"TLS handshake with {address} failed: {exc.reason or exc}") from None
    except TimeoutError:
        sock.close()
        raise WireError(f"TLS handshake with {address} timed out") from None
    except OSError as exc:
        sock.close()
        raise WireError(f"TLS handshake with {address} failed: {exc.strerror or exc}") from None
