"""Broker-to-broker request connections (cluster mode): the transaction coordinator's markers
(``txn_marker_sender``) and a partition leader's KIP-890 verification (``txn_verification``).

One :class:`BrokerConnection` per destination broker and purpose, one request at a time (both
users send few, small requests; a purpose of its own keeps verification from queueing behind a
marker round). :class:`BrokerConnections` keeps them by broker id and reopens one when the
broker's advertised endpoint changes (it restarted elsewhere). Any failure closes the
connection; the next request reconnects. A new connection speaks the inter-broker listener's
protocol (``inter_broker``: TLS, then SASL as the broker's principal) before its first request;
a refused login is an ``InterBrokerAuthError`` (a ConnectionError) like any other failure, and
the calls that follow fail at once with ``BackingOff`` until the growing back-off has passed
(the marker sender and verification retry often; each attempt would otherwise cost both brokers
a SCRAM exchange and a warning).
"""

from __future__ import annotations

import asyncio
import struct
from typing import TYPE_CHECKING, Any

from exactly.client.wire import decode_response, encode_request
from exactly.server.inter_broker import BackingOff, InterBrokerClient, is_refusal, refused_backoff_s

if TYPE_CHECKING:
    from exactly.server.metadata_cache import BrokerEndpoint, MetadataCache

REQUEST_TIMEOUT_S = 30.0
_SIZE = struct.Struct(">i")


class BrokerConnection:
    """One connection to one broker; :meth:`call` sends a kio request entity and returns the
    decoded response (raising OSError / TimeoutError / ConnectionError /
    ``asyncio.IncompleteReadError`` on failure, after closing the connection)."""

    def __init__(
        self,
        endpoint: BrokerEndpoint,
        client_id: str,
        client: InterBrokerClient,
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self.endpoint = endpoint
        self._client_id = client_id
        self._client = client
        self._timeout_s = timeout_s
        self._lock = asyncio.Lock()
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._correlation = 0
        # consecutive refused logins/handshakes, and the loop time before which none is retried
        self._refusals = 0
        self._retry_at = 0.0

    async def call(self, request: Any) -> Any:
        async with self._lock:
            now = asyncio.get_running_loop().time()
            if self._streams is None and now < self._retry_at:
                raise BackingOff(
                    f"broker {self.endpoint.broker_id}: not reconnecting for {self._retry_at - now:.1f} s "
                    f"after {self._refusals} refused attempt(s)"
                )
            try:
                response = await asyncio.wait_for(self._call(request), self._timeout_s)
            except BaseException as exc:
                self.close()
                if is_refusal(exc):
                    self._refusals += 1
                    self._retry_at = now + refused_backoff_s(self._refusals)
                raise
            self._refusals = 0
            return response

    async def _call(self, request: Any) -> Any:
        if self._streams is None:
            host, port = self.endpoint.host, self.endpoint.port
            self._streams = await asyncio.open_connection(
                host, port, **self._client.connect_options(host, self._timeout_s)
            )
            await self._client.authenticate(
                self._exchange, f"broker {self.endpoint.broker_id} at {host}:{port}"
            )
        return await self._exchange(request)

    async def _exchange(self, request: Any) -> Any:
        assert self._streams is not None
        reader, writer = self._streams
        self._correlation += 1
        writer.write(encode_request(request, self._correlation, self._client_id))
        await writer.drain()
        size = _SIZE.unpack(await reader.readexactly(4))[0]
        payload = await reader.readexactly(size)
        corr, response = decode_response(int(request.__api_key__), int(request.__version__), payload)
        if corr != self._correlation:
            raise ConnectionError(f"correlation id {corr}, expected {self._correlation}")
        return response

    def close(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None


class BrokerConnections:
    """Connections by broker id for one purpose (``client_id``), from the metadata cache's
    live brokers."""

    def __init__(
        self,
        cache: MetadataCache,
        client_id: str,
        client: InterBrokerClient,
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self._cache = cache
        self._client_id = client_id
        self._client = client
        self._timeout_s = timeout_s
        self._connections: dict[int, BrokerConnection] = {}

    def get(self, broker_id: int) -> BrokerConnection:
        """The connection to ``broker_id``; ConnectionError when it is not alive."""
        endpoint = self._cache.brokers.get(broker_id)
        conn = self._connections.get(broker_id)
        if conn is not None and conn.endpoint != endpoint:
            conn.close()
            conn = None
            del self._connections[broker_id]
        if conn is None:
            if endpoint is None:
                raise ConnectionError(f"broker {broker_id} is not alive")
            conn = self._connections[broker_id] = BrokerConnection(
                endpoint, self._client_id, self._client, self._timeout_s
            )
        return conn

    def close(self) -> None:
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()
