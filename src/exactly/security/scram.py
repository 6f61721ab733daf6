"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) as Kafka speaks them: credentials and
the server side of one exchange. No I/O.

Credentials hold only (salt, StoredKey, ServerKey, iterations): SaltedPassword =
PBKDF2-HMAC(password, salt, iterations), ClientKey = HMAC(SaltedPassword, "Client Key"),
StoredKey = H(ClientKey), ServerKey = HMAC(SaltedPassword, "Server Key"). The password and the
salted password are never kept.

Kafka's rules followed here: only the gs2 flag ``n`` (no channel binding); an authzid must equal
the user name; the client-final nonce must end with the server-first one (Kafka's
``endsWith``, for librdkafka 2.0's doubled nonce); ``=2C``/``=3D`` escapes in names; no SASLprep (names and passwords are plain
UTF-8); iterations between 4096 and 16384; ``tokenauth`` (delegation tokens) is refused.

Every failure raises ``ScramError`` whose text is for the broker's log only: the client gets
one generic message whatever went wrong (an unknown user and a wrong password look alike)."""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass

MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384


class ScramError(Exception):
    """The exchange failed (malformed message, unknown user, bad proof); log-only text."""


class ScramMechanism(enum.Enum):
    """Kafka's ScramMechanism: the wire type of AlterUserScramCredentials is ``type_id``."""

    SCRAM_SHA_256 = ("SCRAM-SHA-256", "sha256", 1)
    SCRAM_SHA_512 = ("SCRAM-SHA-512", "sha512", 2)

    @property
    def mechanism_name(self) -> str:
        return self.value[0]

    @property
    def hash_name(self) -> str:
        return self.value[1]

    @property
    def type_id(self) -> int:
        return self.value[2]

    @classmethod
    def by_name(cls, name: str) -> ScramMechanism | None:
        return next((m for m in cls if m.mechanism_name == name), None)

    @classmethod
    def by_type(cls, type_id: int) -> ScramMechanism | None:
        return next((m for m in cls if m.type_id == type_id), None)

    def hmac(self, key: bytes, data: bytes) -> bytes:
        return hmac.new(key, data, self.hash_name).digest()

    def hash(self, data: bytes) -> bytes:
        return hashlib.new(self.hash_name, data).digest()


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


def credential_from_salted_password(
    mechanism: ScramMechanism, salt: bytes, salted_password: bytes, iterations: int
) -> ScramCredential:
    """What the broker stores for AlterUserScramCredentials' upsertion (the admin client salts
    and hashes the password itself)."""
    client_key = mechanism.hmac(salted_password, b"Client Key")
    return ScramCredential(
        salt, mechanism.hash(client_key), mechanism.hmac(salted_password, b"Server Key"), iterations
    )


def salted_password(mechanism: ScramMechanism, password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(mechanism.hash_name, password.encode(), salt, iterations)


def credential_from_password(
    mechanism: ScramMechanism, password: str, iterations: int = MIN_ITERATIONS, salt: bytes | None = None
) -> ScramCredential:
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations must be {MIN_ITERATIONS}..{MAX_ITERATIONS}, got {iterations}")
    salt = salt if salt is not None else os.urandom(32)
    return credential_from_salted_password(
        mechanism, salt, salted_password(mechanism, password, salt, iterations), iterations
    )


def unescape_name(name: str) -> str:
    if re.search(r"=(?!2C|3D)", name):
        raise ScramError(f"invalid escape in SCRAM user name {name!r}")
    return name.replace("=2C", ",").replace("=3D", "=")


_PRINTABLE_NONCE = re.compile(r"[\x21-\x2b\x2d-\x7e]+")
_CLIENT_FIRST = re.compile(r"n,(?:a=([^,]*))?,(n=([^,]*),r=([^,]*)((?:,[A-Za-z]+=[^,]*)*))")
_CLIENT_FINAL = re.compile(r"(c=([^,]*),r=([^,]*)((?:,[A-Za-z]+=[^,]*)*)),p=([^,]*)")


def _b64decode(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ScramError(f"{what} is not base64") from None


@dataclass(frozen=True, slots=True)
class ServerFirst:
    """What the server remembers between its first message and the client's final one."""

    user: str
    gs2_header: str
    client_first_bare: str
    server_first: str
    nonce: str
    credential: ScramCredential


class ScramServer:
    """One exchange: ``client_first`` -> server-first message, then ``client_final`` ->
    server-final message and the authenticated user name. Each method is called once, in that
    order (the SASL state machine guarantees it)."""

    def __init__(
        self,
        mechanism: ScramMechanism,
        lookup: Callable[[str, ScramMechanism], ScramCredential | None],
        nonce: Callable[[], str] | None = None,
    ) -> None:
        self.mechanism = mechanism
        self._lookup = lookup
        # alphanumeric, as Kafka's ScramFormatter.secureRandomString (librdkafka 2.0 garbles a
        # nonce holding base64's '+' or '/')
        self._nonce = nonce or (lambda: secrets.token_hex(16))
        self._first: ServerFirst | None = None
        self._done_first = False

    @property
    def expecting_final(self) -> bool:
        """The client-first message has been handled: the next token is the client-final one."""
        return self._done_first

    def client_first(self, token: bytes) -> bytes:
        if self._done_first:
            raise ScramError("a second client-first message")
        self._done_first = True
        try:
            text = token.decode()
        except UnicodeDecodeError:
            raise ScramError("client-first message is not UTF-8") from None
        m = _CLIENT_FIRST.fullmatch(text)
        if m is None:
            raise ScramError("malformed client-first message (only gs2 flag 'n' is supported)")
        authzid, bare, saslname, cnonce, extensions = m.groups()
        user = unescape_name(saslname)
        if not user:
            raise ScramError("empty user name")
        if authzid and unescape_name(authzid) != user:
            raise ScramError("authorization id differs from the user name")
        if not _PRINTABLE_NONCE.fullmatch(cnonce):
            raise ScramError("malformed client nonce")
        for ext in filter(None, extensions.split(",")):
            key, _, value = ext.partition("=")
            if key == "tokenauth" and value.lower() == "true":
                raise ScramError("delegation tokens are not supported")
        credential = self._lookup(user, self.mechanism)
        if credential is None:
            raise ScramError(f"unknown user {user!r} for {self.mechanism.mechanism_name}")
        nonce = cnonce + self._nonce()
        server_first = f"r={nonce},s={base64.b64encode(credential.salt).decode()},i={credential.iterations}"
        gs2 = text[: len(text) - len(bare)]
        self._first = ServerFirst(user, gs2, bare, server_first, nonce, credential)
        return server_first.encode()

    def client_final(self, token: bytes) -> tuple[bytes, str]:
        first = self._first
        if first is None:
            raise ScramError("client-final message before client-first")
        self._first = None
        try:
            text = token.decode()
        except UnicodeDecodeError:
            raise ScramError("client-final message is not UTF-8") from None
        m = _CLIENT_FINAL.fullmatch(text)
        if m is None:
            raise ScramError("malformed client-final message")
        without_proof, binding, nonce, _ext, proof_b64 = m.groups()
        if _b64decode(binding, "channel binding") != first.gs2_header.encode():
            raise ScramError("channel binding does not match the gs2 header")
        # Kafka's check is endsWith, not equality: librdkafka up to 2.0 (kcat 1.7) sends the
        # client nonce twice. The proof still covers the message as sent, so nothing is weakened
        # beyond what Kafka accepts.
        if not nonce.endswith(first.nonce):
            raise ScramError("nonce mismatch")
        proof = _b64decode(proof_b64, "client proof")
        mech = self.mechanism
        auth_message = f"{first.client_first_bare},{first.server_first},{without_proof}".encode()
        signature = mech.hmac(first.credential.stored_key, auth_message)
        if len(proof) != len(signature):
            raise ScramError("client proof has the wrong length")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(mech.hash(client_key), first.credential.stored_key):
            raise ScramError(f"invalid proof for user {first.user!r}")
        server_signature = mech.hmac(first.credential.server_key, auth_message)
        return b"v=" + base64.b64encode(server_signature), first.user
