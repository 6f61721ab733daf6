"""Broker counters: requests and errors per API (Kafka's RequestMetrics ErrorsPerSec analog),
duplicate batches acknowledged by the idempotence cache, bytes in and out.

Kept as plain integers updated from the event loop (no locks needed). ``log_summary`` writes a
line when something changed since the last one, so an idle broker's log stays quiet.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey

log = logging.getLogger("exactly.metrics")


class Metrics:
    """The broker's counters: requests and errors by API, bytes in and out, records in,
    duplicate batches, expired offsets and removed groups.

    Owned by the Broker for its whole life; only ever incremented (never reset), from the event
    loop, so there is no locking. Read by the periodic summary log line (``log_summary``) and
    by the Prometheus collector at scrape time."""

    def __init__(self) -> None:
        self.requests: Counter[int] = Counter()
        self.errors: Counter[tuple[int, int]] = Counter()  # (api key, error code)
        self.duplicate_batches = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.messages_in = 0
        self.offsets_expired = 0  # offset retention (Kafka's offset-expiration-count)
        self.groups_removed = 0
        # (resource type, operation) -> requests' checks the authorizer denied
        self.authorization_denied: Counter[tuple[str, str]] = Counter()
        # (listener, mechanism, succeeded): Kafka's successful-/failed-authentication-total
        self.authentications: Counter[tuple[str, str, bool]] = Counter()
        self._last_logged: tuple[int, int, int] = (0, 0, 0)
        self._last_time = time.monotonic()

    def error(self, api_key: int, code: int) -> None:
        if code:
            self.errors[(api_key, code)] += 1

    def authentication(self, listener: str, mechanism: str, ok: bool) -> None:
        self.authentications[(listener, mechanism, ok)] += 1

    def snapshot(self) -> dict[str, object]:
        return {
            "requests": {str(k): v for k, v in self.requests.items()},
            "errors": {f"{k}:{_name(c)}": v for (k, c), v in self.errors.items()},
            "duplicate_batches": self.duplicate_batches,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "messages_in": self.messages_in,
        }

    def log_summary(self, force: bool = False) -> None:
        state = (sum(self.requests.values()), sum(self.errors.values()), self.duplicate_batches)
        if not force and state == self._last_logged:
            return
        self._last_logged = state
        errors = ", ".join(f"api{k}:{_name(c)}={v}" for (k, c), v in sorted(self.errors.items())) or "none"
        log.info(
            "stats: requests=%d messages_in=%d bytes_in=%d bytes_out=%d duplicate_batches=%d errors: %s",
            state[0],
            self.messages_in,
            self.bytes_in,
            self.bytes_out,
            self.duplicate_batches,
            errors,
        )


def api_name(api_key: int) -> str:
    """Kafka's request name of an API key (``FindCoordinator``), or the number."""
    try:
        return ApiKey(api_key).name.title().replace("_", "")
    except ValueError:
        return str(api_key)


def error_name(code: int) -> str:
    """Kafka's name of an error code (``NOT_COORDINATOR``), or the number."""
    return _name(code)


def _name(code: int) -> str:
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return str(code)
