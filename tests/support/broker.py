"""The real broker as a subprocess for tests: the launcher lives in :mod:`exactly.testing.broker`
(shared with bench/ and the demo); this module keeps the names tests import."""

from __future__ import annotations

from exactly.testing.broker import LISTEN_PREFIX, SRC_DIR, Broker, BrokerError, child_env, serve_command

__all__ = ["LISTEN_PREFIX", "SRC_DIR", "Broker", "BrokerError", "child_env", "serve_command"]
