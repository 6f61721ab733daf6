"""quick_init: the same frozen dataclass, a cheaper constructor."""

from __future__ import annotations

import dataclasses
import pickle
import struct
from dataclasses import dataclass, field

import pytest

from exactly.frozen import quick_init
from exactly.records.batch import BatchHeader


@quick_init
@dataclass(frozen=True, slots=True)
class Point:
    x: int
    y: int
    label: str | None = None


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    size: int
    name: str = "n"


@dataclass(frozen=True, slots=True)
class PlainPoint:
    x: int
    y: int
    label: str | None = None


def test_constructs_the_same_object_as_the_dataclass_init() -> None:
    p = Point(1, 2)
    assert (p.x, p.y, p.label) == (1, 2, None)
    assert Point(1, 2, "a") == Point(x=1, y=2, label="a")
    assert hash(Point(1, 2)) == hash(Point(1, 2))
    assert repr(Point(1, 2, "a")) == repr(PlainPoint(1, 2, "a")).replace("PlainPoint", "Point")
    assert dataclasses.replace(p, y=5) == Point(1, 5)
    assert pickle.loads(pickle.dumps(p)) == p


def test_stays_frozen() -> None:
    p = Point(1, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 3  # type: ignore[misc]


def test_keeps_the_signature_errors() -> None:
    with pytest.raises(TypeError):
        Point(1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Point(1, 2, "a", "b")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Options(3)  # type: ignore[misc]
    assert Options(size=3) == Options(size=3, name="n")


def test_refuses_what_it_cannot_reproduce() -> None:
    with pytest.raises(AssertionError):

        @quick_init
        @dataclass(frozen=True, slots=True)
        class WithFactory:
            items: list[int] = field(default_factory=list)

    with pytest.raises(AssertionError):

        @quick_init
        @dataclass(slots=True)
        class NotFrozen:
            x: int

    with pytest.raises(AssertionError):

        @quick_init
        @dataclass(frozen=True)
        class NoSlots:
            x: int

    with pytest.raises(AssertionError):

        @quick_init
        @dataclass(frozen=True, slots=True)
        class PostInit:
            x: int

            def __post_init__(self) -> None:
                pass


def test_batch_header_parse_equals_the_constructor() -> None:
    fields = (7, 100, 3, 2, 0xDEADBEEF, 0x10, 4, 1000, 1004, 42, 1, 9, 5)
    raw = bytearray(5) + struct.pack(">qiibIhiqqqhii", *fields)
    assert BatchHeader.parse(raw, 5) == BatchHeader(*fields, position=5)
