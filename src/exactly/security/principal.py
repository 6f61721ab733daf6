"""Principals: ``User:ANONYMOUS``, ``User:<SASL name>``, and for TLS client certificates the
subject DN mapped by ``ssl.principal.mapping.rules`` (Kafka's DefaultKafkaPrincipalBuilder and
SslPrincipalMapper).

The DN is built the way Java's ``X500Principal.getName()`` (RFC 2253) prints it: RDNs in
reverse certificate order (CN first), short attribute names, ``,+"\\<>;`` and a leading ``#`` or
space escaped with a backslash. Python's ``getpeercert()`` gives the subject in certificate order
with long names, so it is converted here. One known difference: attributes without an RFC 2253
keyword (emailAddress) print as ``<oid>=value`` here, as ``<oid>=#<hex DER>`` in Java.

Rules: a comma list of ``RULE:<regex>/<replacement>/[L|U]`` and ``DEFAULT``; the first rule whose
regex matches the whole DN gives the name (``$1`` groups, optional lower/upper case), ``DEFAULT``
gives the DN unchanged, and no match at all is a configuration error for that certificate (Kafka
refuses the connection)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

ANONYMOUS = "User:ANONYMOUS"

_SHORT_NAMES = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
    "emailAddress": "1.2.840.113549.1.9.1",
}
_ESCAPE = re.compile(r'([,+"\\<>;])')


class PrincipalMappingError(ValueError):
    """No rule maps this DN, or a rule is malformed."""


def _escape(value: str) -> str:
    out = _ESCAPE.sub(r"\\\1", value)
    if out.startswith(("#", " ")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out


def subject_dn(subject: Sequence[Sequence[tuple[str, str]]]) -> str:
    """``ssl.getpeercert()['subject']`` -> the RFC 2253 DN Java prints."""
    rdns = []
    for rdn in reversed(subject):
        rdns.append("+".join(f"{_SHORT_NAMES.get(k, k)}={_escape(v)}" for k, v in rdn))
    return ",".join(rdns)


@dataclass(frozen=True, slots=True)
class MappingRule:
    pattern: re.Pattern[str] | None  # None: DEFAULT
    replacement: str = ""
    case: str = ""  # "", "L" or "U"

    def apply(self, dn: str) -> str | None:
        if self.pattern is None:
            return dn
        match = self.pattern.fullmatch(dn)
        if match is None:
            return None
        # Java's $1 -> the group's text; the replacement is otherwise literal
        name = re.sub(r"\$(\d+)", lambda m: match.group(int(m.group(1))) or "", self.replacement)
        if self.case == "L":
            return name.lower()
        if self.case == "U":
            return name.upper()
        return name


_RULE = re.compile(r"\s*(DEFAULT|RULE:((?:\\.|[^\\/])+)/((?:\\.|[^\\/])*)/([LU]?))\s*(?:,|$)")


def parse_rules(text: str) -> tuple[MappingRule, ...]:
    """``ssl.principal.mapping.rules`` -> rules, in order (empty text: DEFAULT)."""
    text = text.strip()
    if not text:
        return (MappingRule(None),)
    rules: list[MappingRule] = []
    pos = 0
    while pos < len(text):
        m = _RULE.match(text, pos)
        if m is None or m.end() == pos:
            raise PrincipalMappingError(f"invalid ssl.principal.mapping.rules at {text[pos:]!r}")
        if m.group(1) == "DEFAULT":
            rules.append(MappingRule(None))
        else:
            try:
                pattern = re.compile(m.group(2))
            except re.error as exc:
                raise PrincipalMappingError(f"invalid rule regex {m.group(2)!r}: {exc}") from None
            rules.append(MappingRule(pattern, m.group(3), m.group(4)))
        pos = m.end()
    return tuple(rules)


def map_dn(rules: Sequence[MappingRule], dn: str) -> str:
    """The principal name of a DN; raises PrincipalMappingError when no rule applies."""
    for rule in rules:
        name = rule.apply(dn)
        if name is not None:
            return name
    raise PrincipalMappingError(f"no ssl.principal.mapping.rules rule matches {dn!r}")


def user(name: str) -> str:
    return f"User:{name}"
