"""Client security options shared by every command that talks to a broker:

* ``--command-config FILE``: a Java properties file, as Kafka's ``kafka-*.sh --command-config``
  (``security.protocol=SASL_SSL``, ``sasl.mechanism=SCRAM-SHA-512``, ``sasl.jaas.config=...``,
  ``ssl.truststore.type=PEM`` ...);
* ``-X KEY=VALUE`` (repeatable), as kcat: librdkafka's names, applied after the file.

The result is one dict (:func:`security_config`) that the commands give unchanged to
confluent-kafka's AdminClient/Consumer/Producer and to the project's wire client, so both kinds
of tool reach a secured broker with the same settings. ``sasl.jaas.config`` and a PEM truststore
are translated to librdkafka's names (:func:`exactly.client.security.translate_java_security`).
``bootstrap.servers`` in the file is ignored: ``--bootstrap-server`` says where to connect.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from exactly.client.security import translate_java_security

__all__ = ["add_security_options", "parse_properties", "security_config"]


def parse_properties(text: str) -> dict[str, str]:
    """The subset of Java's properties format that client configs use: ``#``/``!`` comments,
    ``key=value``, ``key: value`` or ``key value``, lines continued by a trailing backslash.
    Later keys win."""
    out: dict[str, str] = {}
    pending = ""
    for raw in text.splitlines():
        line = raw.strip() if not pending else raw.lstrip()
        if not pending and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:  # an odd number of backslashes continues the line
            pending += line[:-1]
            continue
        line, pending = pending + line, ""
        _store(out, line)
    if pending:
        _store(out, pending)
    return out


def _store(out: dict[str, str], line: str) -> None:
    cut = min((i for i in (line.find("="), line.find(":"), _first_space(line)) if i >= 0), default=-1)
    if cut < 0:
        out[line] = ""
        return
    key, rest = line[:cut].strip(), line[cut:].lstrip()
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip()
    out[key] = rest.replace("\\\\", "\\")


def _first_space(line: str) -> int:
    return next((i for i, c in enumerate(line) if c in " \t"), -1)


def _properties_file(text: str) -> dict[str, str]:
    try:
        return parse_properties(Path(text).read_text(encoding="utf-8"))
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {text}: {exc.strerror or exc}") from None


def _setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def add_security_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--command-config",
        type=_properties_file,
        default=None,
        metavar="FILE",
        help="client properties file, as Kafka's tools (security.protocol, ssl.*, sasl.*)",
    )
    parser.add_argument(
        "-X",
        dest="client_settings",
        type=_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="client setting by librdkafka name, e.g. -X security.protocol=SASL_SSL (repeatable)",
    )


def security_config(args: argparse.Namespace) -> dict[str, Any]:
    """The settings of ``--command-config`` then ``-X``, Java names translated. Raises
    :class:`~exactly.client.security.ClientConfigError` on an unusable ``sasl.jaas.config``."""
    conf: dict[str, str] = dict(getattr(args, "command_config", None) or {})
    conf.update(getattr(args, "client_settings", None) or [])
    conf.pop("bootstrap.servers", None)
    return dict(translate_java_security(conf))
