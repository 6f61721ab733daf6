"""Certificate subjects as Java prints them, and ssl.principal.mapping.rules."""

from __future__ import annotations

import pytest

from exactly.security.principal import PrincipalMappingError, map_dn, parse_rules, subject_dn


def test_subject_is_reversed_with_short_names_and_escapes() -> None:
    subject = (
        (("countryName", "US"),),
        (("organizationName", "org"),),
        (("organizationalUnitName", "ServiceUsers"),),
        (("commonName", "svc,one"),),
    )
    assert subject_dn(subject) == "CN=svc\\,one,OU=ServiceUsers,O=org,C=US"
    assert subject_dn(((("commonName", "#lead"),),)) == "CN=\\#lead"


def test_default_rule_keeps_the_dn() -> None:
    assert map_dn(parse_rules("DEFAULT"), "CN=a,O=b") == "CN=a,O=b"
    assert map_dn(parse_rules(""), "CN=a,O=b") == "CN=a,O=b"


def test_rules_first_match_wins_with_groups_and_case() -> None:
    rules = parse_rules(
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, RULE:^CN=(.*?),OU=(.*?),.*$/$1@$2/U, DEFAULT"
    )
    assert map_dn(rules, "CN=Writer,OU=ServiceUsers,O=org") == "writer"
    assert map_dn(rules, "CN=bob,OU=eng,O=org") == "BOB@ENG"
    assert map_dn(rules, "CN=x") == "CN=x"


def test_no_matching_rule_and_bad_rules_are_errors() -> None:
    with pytest.raises(PrincipalMappingError):
        map_dn(parse_rules("RULE:^CN=(.*)$/$1/"), "O=x")
    for bad in ("RULE:(/x/", "NOPE", "RULE:a/b"):
        with pytest.raises(PrincipalMappingError):
            parse_rules(bad)
