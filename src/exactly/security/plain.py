"""SASL PLAIN (RFC 4616) with Kafka's default server callback: users and passwords from the
JAAS configuration of the listener (``listener.name.<listener>.plain.sasl.jaas.config``), in
Kafka's PlainLoginModule syntax::

    org.apache.kafka.common.security.plain.PlainLoginModule required \\
        username="admin" password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";

Each ``user_<name>="<password>"`` option is an account (``username``/``password`` are what the
broker itself would send as a client; ignored here). As in Kafka these are plain-text passwords
in the configuration file; SCRAM is the mechanism whose credentials are stored salted. No I/O."""

from __future__ import annotations

import hmac
import re
from collections.abc import Mapping

PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"

_OPTION = re.compile(r'\s*([A-Za-z0-9_.\-]+)\s*=\s*(?:"((?:\\.|[^"\\])*)"|([^\s;"]+))')


class JaasError(ValueError):
    """A JAAS configuration Kafka would refuse."""


class PlainError(Exception):
    """PLAIN authentication failed; log-only text."""


def parse_jaas_options(text: str) -> tuple[str, dict[str, str]]:
    """``<LoginModule> <flag> key="value" ...;`` -> (login module, options). One module only,
    as Kafka requires for ``sasl.jaas.config``."""
    text = text.strip()
    m = re.match(r"([A-Za-z0-9_.$]+)\s+(required|requisite|sufficient|optional)\b", text)
    if m is None:
        raise JaasError("sasl.jaas.config must start with '<LoginModule> required'")
    pos = m.end()
    options: dict[str, str] = {}
    while True:
        om = _OPTION.match(text, pos)
        if om is None:
            break
        quoted, bare = om.group(2), om.group(3)
        options[om.group(1)] = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare
        pos = om.end()
    if not text[pos:].strip() == ";":
        raise JaasError(f"sasl.jaas.config: unexpected text {text[pos:].strip()[:40]!r} (missing ';'?)")
    return m.group(1), options


def plain_users(jaas_config: str) -> dict[str, str]:
    """The ``user_<name>`` accounts of a PlainLoginModule configuration."""
    module, options = parse_jaas_options(jaas_config)
    if module != PLAIN_LOGIN_MODULE:
        raise JaasError(f"PLAIN needs {PLAIN_LOGIN_MODULE}, got {module}")
    return {k[len("user_") :]: v for k, v in options.items() if k.startswith("user_") and len(k) > 5}


def authenticate_plain(token: bytes, users: Mapping[str, str]) -> str:
    """``authzid NUL user NUL password`` -> the user name; raises PlainError."""
    try:
        text = token.decode()
    except UnicodeDecodeError:
        raise PlainError("PLAIN token is not UTF-8") from None
    parts = text.split("\x00")
    if len(parts) != 3:
        raise PlainError("PLAIN token must have three NUL-separated fields")
    authzid, user, password = parts
    if not user or not password:
        raise PlainError("PLAIN user name and password must not be empty")
    if authzid and authzid != user:
        raise PlainError("authorization id differs from the user name")
    expected = users.get(user)
    # compared even for an unknown user, so the time taken does not say whether it exists
    ok = hmac.compare_digest(password.encode(), (expected if expected is not None else "\x00").encode())
    if expected is None or not ok:
        raise PlainError(f"invalid PLAIN credentials for user {user!r}")
    return user
