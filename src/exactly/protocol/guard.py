"""Refuse request bodies whose array lengths cannot fit the bytes that are left.

Why: kio 0.6.5's native (Rust) reader reserves memory for an array from its length prefix before
reading any element, so a 20-byte frame claiming 2**31 elements asks for hundreds of GB and the
allocator aborts the whole process (SIGABRT; no Python exception). Found by the fuzz suite
(tests/fuzz). An array of n elements needs at least n bytes, so a length above the bytes left is
always invalid: rejecting it never refuses a valid request, and Kafka closes the connection on an
unparseable request, so that is what the dispatcher does.

``overlong_array`` walks a body by its kio schema, checking every array length prefix; it stops
quietly (None) at truncation or anything it does not understand, leaving those to kio's ordinary
parse errors. The walk is bounded by the frame: every element it visits consumes at least one
byte, or the array was short enough to fit.
"""

from __future__ import annotations

import dataclasses
import struct
import types
import typing
from typing import Any

from exactly.protocol.primitives import WireFormatError, read_uvarint, write_uvarint

_FIXED = {
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "bool": 1,
    "uuid": 16,
    "timedelta_i32": 4,
    "timedelta_i64": 8,
    "uint16": 2,
    "uint32": 4,
    "float64": 8,
    "error_code": 2,
    "datetime_i64": 8,
}
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")

Buffer = bytes | bytearray
_Plan = tuple[tuple[str, str, Any, bool, bool], ...]


class _Stop(Exception):
    """Truncated or not understood: leave it to kio (so is a WireFormatError from a varint)."""


class _Overlong(Exception):
    pass


class _Null(Exception):
    """A null length where the schema does not allow null: Kafka's parser rejects the request."""


_PLANS: dict[type[Any], _Plan] = {}


def _plan(cls: type[Any]) -> _Plan:
    """(name, kind, element class, is_array, nullable) per untagged field; kind is 'entity' or a
    kafka type."""
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _PLANS[cls] = _make_plan(cls)
    return plan


def _make_plan(cls: type[Any]) -> _Plan:
    hints = typing.get_type_hints(cls)
    out: list[tuple[str, str, Any, bool, bool]] = []
    for f in dataclasses.fields(cls):
        if "tag" in f.metadata:
            continue
        hint = hints[f.name]
        nullable = False
        if typing.get_origin(hint) in (types.UnionType, typing.Union):
            nullable = type(None) in typing.get_args(hint)
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            hint = args[0] if len(args) == 1 else hint
        is_array = typing.get_origin(hint) is tuple
        elem = typing.get_args(hint)[0] if is_array else hint
        if isinstance(elem, type) and dataclasses.is_dataclass(elem):
            out.append((f.name, "entity", elem, is_array, nullable))
        else:
            out.append((f.name, str(f.metadata.get("kafka_type", "?")), None, is_array, nullable))
    return tuple(out)


def _length(buf: Buffer, pos: int, flexible: bool, legacy: struct.Struct) -> tuple[int, int]:
    if flexible:
        n, pos = read_uvarint(buf, pos)
        return n - 1, pos
    if pos + legacy.size > len(buf):
        raise _Stop
    value: int = legacy.unpack_from(buf, pos)[0]
    return value, pos + legacy.size


def _value(kind: str, buf: Buffer, pos: int, flexible: bool, nullable: bool = True) -> int:
    size = _FIXED.get(kind)
    if size is not None:
        if pos + size > len(buf):
            raise _Stop
        return pos + size
    if kind in ("string", "bytes", "records"):
        n, pos = _length(buf, pos, flexible, _I16 if kind == "string" else _I32)
        if n < 0:
            if not nullable and kind == "string":
                raise _Null
            return pos  # null
        if n > len(buf) - pos:
            raise _Stop  # kio raises an ordinary error for these
        return pos + n
    raise _Stop


_Edit = tuple[int, int, bytes]  # replace buf[start:end] with these bytes


def _known_tags(cls: type[Any]) -> frozenset[int]:
    tags = _TAGS.get(cls)
    if tags is None:
        tags = _TAGS[cls] = frozenset(
            int(f.metadata["tag"]) for f in dataclasses.fields(cls) if "tag" in f.metadata
        )
    return tags


_TAGS: dict[type[Any], frozenset[int]] = {}


def _entity(cls: type[Any], buf: Buffer, pos: int, path: str, edits: list[_Edit] | None = None) -> int:
    flexible = bool(getattr(cls, "__flexible__", False))
    for name, kind, elem, is_array, nullable in _plan(cls):
        where = f"{path}.{name}"
        if is_array:
            n, pos = _length(buf, pos, flexible, _I32)
            if n < 0:
                if not nullable:
                    raise _Null(where)
                continue
            if n > len(buf) - pos:
                raise _Overlong(f"{where}[{n}]")
            for _ in range(n):
                if kind == "entity":
                    pos = _entity(elem, buf, pos, where, edits)
                else:
                    pos = _value(kind, buf, pos, flexible)
        elif kind == "entity":
            pos = _entity(elem, buf, pos, where, edits)
        else:
            try:
                pos = _value(kind, buf, pos, flexible, nullable)
            except _Null:
                raise _Null(where) from None
    if flexible:
        start = pos
        count, pos = read_uvarint(buf, pos)
        if count > len(buf) - pos:
            raise _Stop
        kept: list[tuple[int, int]] = []
        known = _known_tags(cls) if edits is not None else frozenset()
        for _ in range(count):
            field_start = pos
            tag, pos = read_uvarint(buf, pos)
            size, pos = read_uvarint(buf, pos)
            if size > len(buf) - pos:
                raise _Stop
            pos += size
            if tag in known:
                kept.append((field_start, pos))
        if edits is not None and len(kept) < count:
            section = write_uvarint(len(kept)) + b"".join(bytes(buf[a:b]) for a, b in kept)
            edits.append((start, pos, section))
    return pos


def without_unknown_tags(request_cls: type[Any], buf: Buffer, pos: int) -> bytes | None:
    """``buf[pos:]`` with every tagged field its schema does not know removed, or None when there
    were none (or the body is truncated or not understood; kio's parse error stands then).

    Why: kio's reader raises on an unknown tag, while Kafka skips them (a newer client may send
    tags this broker's schema predates); the dispatcher retries the parse on these bytes.
    """
    edits: list[_Edit] = []
    try:
        _entity(request_cls, buf, pos, request_cls.__name__, edits)
    except (_Stop, WireFormatError, _Overlong, _Null, RecursionError):
        return None
    if not edits:
        return None
    out = bytearray()
    last = pos
    for start, end, section in edits:
        out += buf[last:start]
        out += section
        last = end
    out += buf[last:]
    return bytes(out)


def overlong_array(request_cls: type[Any], buf: Buffer, pos: int) -> str | None:
    """What kio must not be asked to parse, or None: the path of the first array length prefix
    that cannot fit the bytes left (kio would abort the process), or of a null array or string
    where the schema allows none (kio would hand the handler a None; Kafka's parser refuses it)."""
    try:
        _entity(request_cls, buf, pos, request_cls.__name__)
    except _Overlong as exc:
        return str(exc)
    except _Null as exc:
        return f"null {exc} is not nullable"
    except (_Stop, WireFormatError, RecursionError):  # a bad varint: kio refuses it too
        return None
    return None
