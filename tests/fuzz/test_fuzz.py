"""Bounded fuzzing for CI (the long run is tests/fuzz/run_fuzz.py): the broker's framer, the request
header, record-batch validation, and the dispatcher with random bytes, schema-valid requests of
every API/version and mutations of valid requests. Nothing may raise anything but the documented
errors; the dispatcher answers or closes, and stays healthy."""

from __future__ import annotations

import asyncio
import random
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exactly.protocol.framing import FrameError, Framer
from exactly.protocol.header import HeaderError, parse_request_header
from exactly.records.batch import InvalidRecordError, compute_crc, iter_batches, validate_produce_records
from exactly.records.builder import Record, build_batch
from tests.fuzz.harness import (
    InProcessBroker,
    Mutator,
    Stats,
    _strategy,
    api_versions,
    encode,
    health_requests,
    produce_seeds,
)
from tests.fuzz.kio_guard import would_abort
from tests.support.framer import feed_chunks
from tests.support.wire import WireClient

pytestmark = pytest.mark.timeout(240)
FAST = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


# ------------------------------------------------------------------ pure decoders
@FAST
@given(st.lists(st.binary(max_size=64), max_size=20), st.integers(0, 200))
def test_framer_yields_whole_frames_or_refuses(chunks: list[bytes], limit: int) -> None:
    framer = Framer(max_frame_size=limit)
    data = b"".join(chunks)
    try:
        feed_chunks(framer, chunks)
    except FrameError:
        return
    # reference split of the same bytes
    pos, want = 0, []
    while len(data) - pos >= 4:
        (size,) = struct.unpack_from(">i", data, pos)
        assert 0 <= size <= limit
        if len(data) - pos - 4 < size:
            break
        want.append(data[pos + 4 : pos + 4 + size])
        pos += 4 + size
    assert [bytes(f) for f in framer.frames] == want


@FAST
@given(st.binary(max_size=64))
def test_request_header_parses_or_raises_header_error(data: bytes) -> None:
    try:
        header, pos = parse_request_header(data)
    except HeaderError:
        return
    assert 8 <= pos <= len(data)
    assert header.client_id is None or isinstance(header.client_id, str)


def _valid_batch(n: int, pid: int = -1, seq: int = -1, txn: bool = False) -> bytes:
    return build_batch(
        [Record(value=b"x" * i) for i in range(n)],
        producer_id=pid,
        producer_epoch=0 if pid >= 0 else -1,
        base_sequence=seq,
        transactional=txn,
        base_timestamp=int(time.time() * 1000),
    )


@FAST
@given(st.binary(max_size=200))
def test_batch_validation_of_random_bytes(data: bytes) -> None:
    try:
        header = validate_produce_records(data)
    except InvalidRecordError as exc:
        assert int(exc.error_code) in (
            2,
            42,
            43,
            87,
        )  # CORRUPT_MESSAGE, INVALID_RECORD, ..., UNSUPPORTED_FORMAT
        return
    assert header.size == len(data)
    list(iter_batches(data, verify_crc=True))


@FAST
@given(
    st.integers(1, 5),
    st.lists(st.tuples(st.integers(0, 80), st.integers(0, 255)), min_size=1, max_size=6),
    st.booleans(),
)
def test_batch_validation_of_mutated_batches_with_fixed_crc(
    n: int, edits: list[tuple[int, int]], fix: bool
) -> None:
    data = bytearray(_valid_batch(n, pid=3, seq=0, txn=n % 2 == 0))
    for at, value in edits:
        if at < len(data):
            data[at] = value
    if fix and len(data) >= 61:
        struct.pack_into(">I", data, 17, compute_crc(data, 0, len(data)))
    try:
        header = validate_produce_records(bytes(data))
    except InvalidRecordError:
        return
    assert header.record_count == header.last_offset_delta + 1 > 0 and not header.is_control


# ------------------------------------------------------------------ the dispatcher
@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


@pytest.fixture(scope="module")
def ib(loop: asyncio.AbstractEventLoop) -> Iterator[InProcessBroker]:
    b = loop.run_until_complete(InProcessBroker().open())
    yield b
    loop.run_until_complete(b.close())


def feed(loop: asyncio.AbstractEventLoop, ib: InProcessBroker, payload: bytes, stats: Stats) -> str:
    outcome = loop.run_until_complete(ib.feed(payload, stats))
    assert outcome != "crash", stats.crashes[-1][1]
    return outcome


def assert_healthy(loop: asyncio.AbstractEventLoop, ib: InProcessBroker) -> None:
    assert loop.run_until_complete(ib.healthy()), "valid requests fail after the fuzz inputs"


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.binary(max_size=120))
def test_dispatch_random_bytes(loop: Any, ib: InProcessBroker, data: bytes) -> None:
    feed(loop, ib, data, Stats())


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(list(api_versions())), st.binary(max_size=80), st.integers(-1, 2**31 - 1))
def test_dispatch_valid_header_random_body(
    loop: Any, ib: InProcessBroker, kv: tuple[int, int], body: bytes, corr: int
) -> None:
    key, version = kv
    payload = struct.pack(">hhih", key, version, corr, 4) + b"fuzz" + body
    feed(loop, ib, payload, Stats())


@pytest.mark.parametrize("kv", list(api_versions()), ids=lambda kv: f"{kv[0]}v{kv[1]}")
def test_dispatch_schema_valid_requests_of_every_api(
    loop: Any, ib: InProcessBroker, kv: tuple[int, int]
) -> None:
    """Random but schema-valid requests (hypothesis from_type) of one API version."""
    strat = _strategy(*kv)
    stats = Stats()

    @settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(strat, st.integers(0, 2**31 - 1))
    def run(request: Any, corr: int) -> None:
        try:
            payload = encode(request, corr)
        except Exception:  # e.g. a string too long for its length prefix: not a request at all
            return
        feed(loop, ib, payload, stats)

    run()
    assert_healthy(loop, ib)


def test_dispatch_mutations_of_valid_requests(loop: Any, ib: InProcessBroker) -> None:
    rng = random.Random(20240613)
    seeds = produce_seeds(rng) + health_requests()
    from tests.fuzz.harness import schema_seeds

    seeds += schema_seeds(1, rng)
    mut = Mutator(seeds, rng)
    stats = Stats()
    for _ in range(5000):
        feed(loop, ib, mut.next(), stats)
    assert not stats.crashes, stats.crashes[:3]
    assert stats.outcomes["response"] > 500 and stats.outcomes["close"] > 500, dict(stats.outcomes)
    assert_healthy(loop, ib)


# ------------------------------------------------------------------ the known native abort
def test_guard_flags_the_overlong_array_that_aborts_kio() -> None:
    """ListOffsets v6 with topics[0].partitions of 2**31 - 2 elements: kio's native reader would
    try to reserve ~170 GB and abort the broker (notes/broker-bugs.md). The guard must see it."""
    body = bytes([0]) + struct.pack(">ib", -1, 0) + b"\x02" + b"\x02a" + b"\xfe\xff\xff\xff\x0f" + b"\x00" * 8
    payload = struct.pack(">hhih", 2, 6, 1, 4) + b"fuzz" + b"\x00" + body[1:]
    assert would_abort(payload) is not None
    for seed in health_requests() + produce_seeds(random.Random(1)):
        assert would_abort(seed) is None


CRASHERS = Path(__file__).parent / "crashers"


@pytest.mark.parametrize("crasher", sorted(p.name for p in CRASHERS.glob("*overlong-array*.bin")))
def test_saved_crashers_do_not_kill_a_live_broker(fresh_broker: Any, crasher: str) -> None:
    b = fresh_broker()
    with WireClient(b.bootstrap) as c:
        c.send_frame((CRASHERS / crasher).read_bytes())
        assert c.is_closed(5), "neither a response nor a closed connection"
    # a round trip on a new connection after the close: a broker that was going to die of the
    # crasher has died by now
    with WireClient(b.bootstrap) as c:
        from kio.schema.api_versions.v0.request import ApiVersionsRequest

        assert c.send(ApiVersionsRequest()).error_code == 0
    assert b.running, f"the broker died (exit {b.returncode}) on {crasher}"


def test_metadata_negative_name_length_does_not_loop(loop: Any, ib: InProcessBroker) -> None:
    """Found by the 1M fuzz run (fixed in handlers/metadata.py parse_request): a topic name length
    of -2 moved the parser back to where it started, so a topic count of 2**31-1 made it loop
    (and allocate) for minutes on one 20-byte frame."""
    body = struct.pack(">i", 2**31 - 1) + struct.pack(">h", -2) + b"\x00"
    payload = struct.pack(">hhih", 3, 3, 9, 4) + b"fuzz" + body
    started = time.monotonic()
    assert feed(loop, ib, payload, Stats()) == "close"
    assert time.monotonic() - started < 1.0
    saved = (CRASHERS / "metadata-v3-negative-name-length-loop.bin").read_bytes()
    assert feed(loop, ib, saved, Stats()) == "close"
    assert_healthy(loop, ib)


# ------------------------------------------------------------------ SASL before authentication
_SASL_KEYS = st.sampled_from([17, 36, 18, 3, 0, 1, 22, -1, 999])


@st.composite
def _sasl_frames(draw: st.DrawFn) -> bytes:
    """A request frame aimed at the authenticator: a plausible header (often a SASL API) with a
    random body, or plain random bytes (the raw-token framing reads those as tokens)."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=200))
    key, version = draw(_SASL_KEYS), draw(st.integers(-1, 5))
    head = struct.pack(">hhih", key, version, draw(st.integers(0, 2**31 - 1)), -1)
    return head + draw(st.binary(max_size=120))


@FAST
@given(
    st.lists(_sasl_frames(), min_size=1, max_size=8),
    st.sampled_from(["PLAIN", "SCRAM-SHA-512", "SCRAM-SHA-256"]),
)
def test_sasl_authenticator_never_raises_and_serves_nothing_before_authentication(
    frames: list[bytes], mechanism: str
) -> None:
    from exactly.security.sasl import Action, SaslAuthenticator, SaslState
    from exactly.security.scram import ScramMechanism, credential_from_password

    cred = credential_from_password(ScramMechanism.SCRAM_SHA_512, "pw")
    auth = SaslAuthenticator(
        ("PLAIN", "SCRAM-SHA-512", "SCRAM-SHA-256"),
        {"u": "a-long-password-hypothesis-will-not-guess"},
        lambda user, mech: cred if (user, mech) == ("u", ScramMechanism.SCRAM_SHA_512) else None,
    )
    # sometimes start from a proper handshake, so random tokens reach the mechanisms
    if frames[0][:2] == b"\x00\x00":
        head = struct.pack(">hhih", 17, frames[0][2] % 2, 1, -1)
        frames = [head + struct.pack(">h", len(mechanism)) + mechanism.encode(), *frames[1:]]
    for frame in frames:
        before = auth.state
        step = auth.receive(frame)
        if step.action is Action.DISPATCH:  # only a well-formed ApiVersions header, first
            assert before is SaslState.INITIAL_REQUEST and frame[:2] == b"\x00\x12"
        if step.action is Action.AUTHENTICATED:  # random bytes cannot hold the password
            raise AssertionError(f"authenticated from random input: {frames!r}")
        if step.action in (Action.FAIL, Action.CLOSE):
            assert auth.state is SaslState.FAILED
            break
