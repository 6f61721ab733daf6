"""How inter-broker connection failures are classified, logged and backed off."""

from __future__ import annotations

import logging
import ssl

from exactly.server.inter_broker import (
    REFUSED_BACKOFF_MAX_S,
    BackingOff,
    InterBrokerAuthError,
    failure_level,
    is_refusal,
    refused_backoff_s,
)


def test_refusals_back_off_doubling_up_to_the_maximum() -> None:
    waits = [refused_backoff_s(n) for n in range(1, 9)]
    assert waits[:4] == [0.2, 0.4, 0.8, 1.6]
    assert waits == sorted(waits) and waits[-1] == REFUSED_BACKOFF_MAX_S


def test_refusals_are_warnings_the_rest_is_a_broker_coming_or_going() -> None:
    refused = InterBrokerAuthError("authentication failed as User:broker")
    untrusted = ssl.SSLCertVerificationError("certificate verify failed")
    assert is_refusal(refused) and is_refusal(untrusted)
    assert failure_level(refused) == failure_level(untrusted) == logging.WARNING
    assert not is_refusal(ConnectionRefusedError()) and not is_refusal(TimeoutError())
    assert failure_level(ConnectionRefusedError()) == logging.INFO
    assert failure_level(BackingOff("not reconnecting")) == logging.DEBUG
