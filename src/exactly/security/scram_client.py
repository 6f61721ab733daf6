"""The client side of one SCRAM-SHA-256/512 exchange (RFC 5802, RFC 7677), as Kafka's
ScramSaslClient speaks it: gs2 header ``n,,`` (no channel binding, no authzid), user names with
``=2C``/``=3D`` escapes, no SASLprep, at least 4096 iterations. No I/O.

Three steps, in order: :meth:`ScramClient.client_first` -> the server-first message goes to
:meth:`ScramClient.client_final` -> the server-final message goes to
:meth:`ScramClient.verify_server_final`, which checks the server's signature: a broker that does
not hold the user's ServerKey cannot pass it, so the client knows it talks to the real one.

The key derivations are :mod:`exactly.security.scram`'s (the broker's side of the same
exchange); every failure is a :class:`~exactly.security.scram.ScramError`."""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets
from collections.abc import Callable

from exactly.security.scram import MIN_ITERATIONS, ScramError, ScramMechanism, salted_password

__all__ = ["ScramClient", "escape_name"]

_GS2_HEADER = "n,,"
_CHANNEL_BINDING = base64.b64encode(_GS2_HEADER.encode()).decode()  # "biws"


def escape_name(name: str) -> str:
    """RFC 5802's saslname: ``=`` and ``,`` escaped (``=`` first)."""
    return name.replace("=", "=3D").replace(",", "=2C")


def _fields(message: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in message.split(","):
        key, sep, value = part.partition("=")
        if not sep or len(key) != 1:
            raise ScramError(f"malformed SCRAM message {message[:60]!r}")
        out.setdefault(key, value)
    return out


class ScramClient:
    """One exchange for ``user``/``password``; each method is called once, in order."""

    def __init__(
        self,
        mechanism: ScramMechanism,
        user: str,
        password: str,
        nonce: Callable[[], str] | None = None,
    ) -> None:
        self.mechanism = mechanism
        self._password = password
        self._nonce = (nonce or (lambda: secrets.token_hex(16)))()
        self._first_bare = f"n={escape_name(user)},r={self._nonce}"
        self._server_signature: bytes | None = None

    def client_first(self) -> bytes:
        return (_GS2_HEADER + self._first_bare).encode()

    def client_final(self, server_first: bytes) -> bytes:
        try:
            text = server_first.decode()
        except UnicodeDecodeError:
            raise ScramError("server-first message is not UTF-8") from None
        fields = _fields(text)
        if "e" in fields:
            raise ScramError(f"the server refused: {fields['e']}")
        nonce, salt_b64, iterations_text = fields.get("r"), fields.get("s"), fields.get("i")
        if nonce is None or salt_b64 is None or iterations_text is None:
            raise ScramError("server-first message lacks r, s or i")
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise ScramError("the server nonce does not extend the client nonce")
        if not iterations_text.isdigit() or int(iterations_text) < MIN_ITERATIONS:
            raise ScramError(f"iteration count {iterations_text!r} is below {MIN_ITERATIONS}")
        try:
            salt = base64.b64decode(salt_b64, validate=True)
        except (binascii.Error, ValueError):
            raise ScramError("the salt is not base64") from None
        mech = self.mechanism
        salted = salted_password(mech, self._password, salt, int(iterations_text))
        client_key = mech.hmac(salted, b"Client Key")
        without_proof = f"c={_CHANNEL_BINDING},r={nonce}"
        auth_message = f"{self._first_bare},{text},{without_proof}".encode()
        signature = mech.hmac(mech.hash(client_key), auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = mech.hmac(mech.hmac(salted, b"Server Key"), auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify_server_final(self, server_final: bytes) -> None:
        expected = self._server_signature
        if expected is None:
            raise ScramError("server-final message before client-final")
        fields = _fields(server_final.decode(errors="replace"))
        if "e" in fields:
            raise ScramError(f"the server refused: {fields['e']}")
        try:
            got = base64.b64decode(fields.get("v", ""), validate=True)
        except (binascii.Error, ValueError):
            raise ScramError("the server signature is not base64") from None
        if not hmac.compare_digest(got, expected):
            raise ScramError("the server signature is wrong (not the broker holding this user's keys)")
