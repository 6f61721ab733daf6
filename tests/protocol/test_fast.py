"""The hand-written hot-path codecs must be byte-for-byte what kio's generic codec produces."""

from __future__ import annotations

import io

from hypothesis import example, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer

from exactly.protocol.apis import VERSION_RANGES, ApiKey, build, encode_response, schema
from exactly.protocol.fast import (
    FetchPartitionResult,
    ProducePartitionResult,
    encode_fetch_response,
    encode_produce_response,
    parse_produce_request,
)

names = st.text(alphabet="abcxyz._-", min_size=1, max_size=12)
records = st.one_of(st.none(), st.binary(max_size=64))


def _versions(key: ApiKey) -> range:
    lo, hi = VERSION_RANGES[key]
    return range(lo, hi + 1)


@settings(max_examples=40, deadline=None)
@given(
    txn=st.one_of(st.none(), names),
    acks=st.sampled_from([0, 1, -1]),
    topics=st.lists(
        st.tuples(names, st.lists(st.tuples(st.integers(0, 99), records), max_size=3)), max_size=3
    ),
)
def test_produce_request_parse_matches_kio(txn: str | None, acks: int, topics: list) -> None:
    import datetime

    for version in _versions(ApiKey.PRODUCE):
        api = schema(ApiKey.PRODUCE, version)
        mod = api.request_module
        req = build(
            api.request_type,
            transactional_id=txn,
            acks=acks,
            timeout=datetime.timedelta(milliseconds=1500),
            topic_data=tuple(
                build(
                    mod.TopicProduceData,
                    name=n,
                    partition_data=tuple(
                        build(mod.PartitionProduceData, index=i, records=r) for i, r in parts
                    ),
                )
                for n, parts in topics
            ),
        )
        out = io.BytesIO()
        entity_writer(api.request_type)(out, req)
        parsed = parse_produce_request(bytearray(b"HDR" + out.getvalue()), 3, version)
        assert parsed.transactional_id == txn and parsed.acks == acks and parsed.timeout_ms == 1500
        got = [
            (t.name, [(p.index, None if p.records is None else bytes(p.records)) for p in t.partitions])
            for t in parsed.topics
        ]
        assert got == [(n, list(parts)) for n, parts in topics]


@settings(max_examples=30, deadline=None)
@given(
    topics=st.lists(
        st.tuples(
            names,
            st.lists(
                st.tuples(st.integers(0, 99), st.integers(-1, 2**40), st.sampled_from([None, "boom"])),
                max_size=3,
            ),
        ),
        max_size=3,
    )
)
@example(topics=[("orders", [(7, 2**40, None)])])  # the one-partition fast path
@example(topics=[("ü" * 70, [(0, -1, None)])])  # its name length needs two uvarint bytes at v9+
def test_produce_response_matches_kio(topics: list) -> None:
    for version in _versions(ApiKey.PRODUCE):
        api = schema(ApiKey.PRODUCE, version)
        mod = api.response_module
        expected = encode_response(
            api,
            build(
                api.response_type,
                responses=tuple(
                    build(
                        mod.TopicProduceResponse,
                        name=n,
                        partition_responses=tuple(
                            build(
                                mod.PartitionProduceResponse,
                                index=i,
                                error_code=ErrorCode.none if msg is None else ErrorCode.invalid_record,
                                base_offset=off,
                                log_append_time=None,
                                log_start_offset=0,
                                error_message=msg,
                            )
                            for i, off, msg in parts
                        ),
                    )
                    for n, parts in topics
                ),
            ),
        )
        fast = encode_produce_response(
            version,
            [
                (
                    n,
                    [
                        ProducePartitionResult(
                            i, 0 if msg is None else int(ErrorCode.invalid_record), off, -1, 0, msg
                        )
                        for i, off, msg in parts
                    ],
                )
                for n, parts in topics
            ],
        )
        assert fast == expected, version


@settings(max_examples=30, deadline=None)
@given(
    topics=st.lists(
        st.tuples(
            names,
            st.lists(
                st.tuples(
                    st.integers(0, 99),
                    st.one_of(
                        st.none(),
                        st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 2**40)), max_size=2),
                    ),
                    st.binary(max_size=64),  # never None: Fetch never writes null records
                ),
                max_size=3,
            ),
        ),
        max_size=3,
    ),
    session_error=st.sampled_from([0, 70]),
)
def test_fetch_response_matches_kio(topics: list, session_error: int) -> None:
    for version in _versions(ApiKey.FETCH):
        api = schema(ApiKey.FETCH, version)
        mod = api.response_module
        expected = encode_response(
            api,
            build(
                api.response_type,
                error_code=ErrorCode(session_error),
                session_id=0,
                responses=tuple(
                    build(
                        mod.FetchableTopicResponse,
                        topic=n,
                        partitions=tuple(
                            build(
                                mod.PartitionData,
                                partition_index=i,
                                error_code=ErrorCode.none,
                                high_watermark=10,
                                last_stable_offset=9,
                                log_start_offset=1,
                                aborted_transactions=None
                                if ab is None
                                else tuple(
                                    build(mod.AbortedTransaction, producer_id=a, first_offset=b)
                                    for a, b in ab
                                ),
                                preferred_read_replica=-1,
                                records=r,
                            )
                            for i, ab, r in parts
                        ),
                    )
                    for n, parts in topics
                ),
            ),
        )
        chunks = encode_fetch_response(
            version,
            session_error,
            0,
            [(n, [FetchPartitionResult(i, 0, 10, 9, 1, ab, r) for i, ab, r in parts]) for n, parts in topics],
        )
        assert b"".join(bytes(c) for c in chunks) == expected, version


def test_fetch_response_v12_diverging_epoch_matches_kio() -> None:
    """The tagged DivergingEpoch (KIP-595 truncation-on-fetch) of a partition, as kio writes it."""
    api = schema(ApiKey.FETCH, 12)
    mod = api.response_module
    expected = encode_response(
        api,
        build(
            api.response_type,
            error_code=ErrorCode.none,
            session_id=0,
            responses=(
                build(
                    mod.FetchableTopicResponse,
                    topic="t",
                    partitions=(
                        build(
                            mod.PartitionData,
                            partition_index=3,
                            error_code=ErrorCode.none,
                            high_watermark=10,
                            last_stable_offset=9,
                            log_start_offset=1,
                            diverging_epoch=build(mod.EpochEndOffset, epoch=4, end_offset=2**40),
                            aborted_transactions=None,
                            preferred_read_replica=-1,
                            records=b"",
                        ),
                    ),
                ),
            ),
        ),
    )
    chunks = encode_fetch_response(
        12, 0, 0, [("t", [FetchPartitionResult(3, 0, 10, 9, 1, None, b"", diverging_epoch=(4, 2**40))])]
    )
    assert b"".join(bytes(c) for c in chunks) == expected
