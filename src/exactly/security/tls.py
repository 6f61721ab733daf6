"""TLS server contexts from Kafka's ``ssl.*`` settings, PEM only (Kafka's PEM support, 2.7+).

Keystore: ``ssl.keystore.location`` (one PEM file holding the private key and the certificate
chain, Kafka's PEM keystore file) or inline ``ssl.keystore.certificate.chain`` plus
``ssl.keystore.key``; ``ssl.key.password`` for an encrypted key. Truststore (the CAs client
certificates must chain to): ``ssl.truststore.location`` or inline ``ssl.truststore.certificates``.
``ssl.keystore.type``/``ssl.truststore.type`` must be PEM: Python's ssl cannot read JKS, and
PKCS12 would need a third-party package.

Protocols: TLS 1.2 and 1.3 at most what ``ssl.enabled.protocols`` lists (TLSv1/1.1 are refused
at start-up). ``ssl.client.auth``: none (no certificate asked), requested (asked, verified when
sent), required (handshake fails without a valid one)."""

from __future__ import annotations

import os
import ssl
import tempfile
from collections.abc import Callable
from typing import Any

from exactly.security.principal import MappingRule, map_dn, subject_dn

CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}


class TlsConfigError(ValueError):
    """An ssl.* setting the broker cannot use."""


class DirectSSLObject(ssl.SSLObject):
    """``ssl.SSLObject`` whose ``read``, ``write`` and ``pending`` are the C object's own methods.

    Why: the event loop's TLS transport (uvloop's, and asyncio's) decrypts by calling ``read``
    and ``pending`` once per TLS record. ``ssl.SSLObject``'s versions are Python functions that
    only forward to the C object, so each record also paid two Python calls. librdkafka writes a
    TLS record per buffer segment, often one per message (a 10-byte record header and a 1 KB
    value in separate records), so a produce stream carries hundreds of records per MB and the
    forwarding was a measurable share of the broker's TLS cost (bench/results/tls-profile.md).
    Behaviour is unchanged: the same OpenSSL calls with the same arguments, results and
    exceptions (the transports call ``read(n)`` or ``read(n, buffer)``, both of which the C
    method takes). Everything else (handshake, ``getpeercert``, ``cipher``...) is inherited."""

    @classmethod
    def _create(cls, *args: Any, **kwargs: Any) -> DirectSSLObject:
        obj: DirectSSLObject = super()._create(*args, **kwargs)  # type: ignore[misc]
        inner = getattr(obj, "_sslobj", None)
        if inner is not None:  # CPython's layout; elsewhere the inherited methods stay
            obj.__dict__.update(read=inner.read, write=inner.write, pending=inner.pending)
        return obj


def _with_pem_file(text: str, use: Callable[[str], None]) -> None:
    """Inline PEM -> a private temporary file for the ssl module's file-only loaders, removed at once."""
    fd, path = tempfile.mkstemp(suffix=".pem")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text.replace("\\n", "\n"))
        use(path)
    finally:
        os.unlink(path)


def _protocols(setting: Callable[[str], str], ctx: ssl.SSLContext) -> None:
    """TLS 1.2/1.3 as ``ssl.enabled.protocols`` allows, and ``ssl.cipher.suites``."""
    enabled = [
        p.strip() for p in (setting("ssl.enabled.protocols") or "TLSv1.2,TLSv1.3").split(",") if p.strip()
    ]
    unknown = [p for p in enabled if p not in _VERSIONS]
    if unknown or not enabled:
        raise TlsConfigError(
            f"ssl.enabled.protocols: only TLSv1.2 and TLSv1.3 are supported, got {unknown or enabled}"
        )
    ctx.minimum_version = min((_VERSIONS[p] for p in enabled), key=lambda v: v.value)
    ctx.maximum_version = max((_VERSIONS[p] for p in enabled), key=lambda v: v.value)
    ciphers = setting("ssl.cipher.suites")
    if ciphers:
        try:
            ctx.set_ciphers(ciphers.replace(",", ":").replace(" ", ""))
        except ssl.SSLError as exc:
            raise TlsConfigError(f"ssl.cipher.suites: {exc}") from None


def _check_pem_types(setting: Callable[[str], str]) -> None:
    for key in ("ssl.keystore.type", "ssl.truststore.type"):
        kind = setting(key).upper() or "PEM"
        if kind != "PEM":
            raise TlsConfigError(f"{key}={kind} is not supported: use PEM")


def _load_keystore(setting: Callable[[str], str], ctx: ssl.SSLContext) -> bool:
    """The keystore (key + certificate chain) into ``ctx``; False when none is configured."""
    password = setting("ssl.key.password") or None
    location = setting("ssl.keystore.location")
    chain, key = setting("ssl.keystore.certificate.chain"), setting("ssl.keystore.key")
    if location:
        ctx.load_cert_chain(location, None, password)
    elif chain and key:
        _with_pem_file(chain + "\n" + key, lambda path: ctx.load_cert_chain(path, None, password))
    else:
        return False
    return True


def _load_truststore(setting: Callable[[str], str], ctx: ssl.SSLContext) -> bool:
    """The truststore's CAs into ``ctx``; False when none is configured."""
    trust_file, trust_pem = setting("ssl.truststore.location"), setting("ssl.truststore.certificates")
    if trust_file:
        ctx.load_verify_locations(cafile=trust_file)
    elif trust_pem:
        ctx.load_verify_locations(cadata=trust_pem.replace("\\n", "\n"))
    else:
        return False
    return True


def server_context(setting: Callable[[str], str], client_auth: str) -> ssl.SSLContext:
    """One listener's context; ``setting(key)`` gives the listener's value of an ``ssl.*`` key
    ("" when unset)."""
    _check_pem_types(setting)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.sslobject_class = DirectSSLObject
    _protocols(setting, ctx)
    try:
        if not _load_keystore(setting, ctx):
            raise TlsConfigError(
                "a TLS listener needs ssl.keystore.location or ssl.keystore.certificate.chain and ssl.keystore.key"
            )
        mode = CLIENT_AUTH.get(client_auth.lower())
        if mode is None:
            raise TlsConfigError(f"ssl.client.auth must be none, requested or required, got {client_auth!r}")
        if not _load_truststore(setting, ctx) and mode != ssl.CERT_NONE:
            raise TlsConfigError(
                f"ssl.client.auth={client_auth} needs a truststore (ssl.truststore.location)"
            )
        ctx.verify_mode = mode
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"cannot load the TLS key, certificates or truststore: {exc}") from None
    return ctx


def client_context(setting: Callable[[str], str]) -> ssl.SSLContext:
    """The context a broker connects to another broker's TLS listener with (Kafka's client mode
    of the same listener settings): the peer's certificate must chain to the truststore (the
    system's CAs when none is set) and, with ``ssl.endpoint.identification.algorithm=https`` (the
    default), name the host it was reached at; the keystore, when set, is presented as the client
    certificate (what ``ssl.client.auth=required`` on the other side asks for)."""
    _check_pem_types(setting)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _protocols(setting, ctx)
    algorithm = (setting("ssl.endpoint.identification.algorithm") or "").strip().lower()
    if algorithm not in ("https", ""):
        raise TlsConfigError(
            f"ssl.endpoint.identification.algorithm must be https or empty, got {algorithm!r}"
        )
    try:
        _load_keystore(setting, ctx)
        if not _load_truststore(setting, ctx):
            ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"cannot load the TLS key, certificates or truststore: {exc}") from None
    ctx.check_hostname = algorithm == "https"
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def certificate_principal(
    ssl_object: ssl.SSLObject | ssl.SSLSocket | None, rules: tuple[MappingRule, ...]
) -> str | None:
    """``User:<mapped DN>`` of a verified client certificate, None without one."""
    if ssl_object is None:
        return None
    cert = ssl_object.getpeercert()
    if not cert:
        return None
    subject = cert.get("subject")
    if not subject:
        return None
    return "User:" + map_dn(rules, subject_dn(subject))  # type: ignore[arg-type]
