"""Malformed input at the socket level: the broker answers or hangs up as Kafka does, and keeps
serving other clients afterwards."""

from __future__ import annotations

import os
import struct

import pytest
from kio.schema.api_versions.v0.request import ApiVersionsRequest as ApiVersionsV0
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsResponseV0
from kio.schema.api_versions.v3.request import ApiVersionsRequest as ApiVersionsV3
from kio.schema.metadata.v1.request import MetadataRequest as MetadataV1
from kio.schema.write_txn_markers.v1 import request as wm

from tests.support.broker import Broker
from tests.support.wire import (
    WireClient,
    create_topic,
    log_end_offset,
    parse_response,
    partition_response,
    produce_request,
    raw_request,
    simple_batch,
)

pytestmark = pytest.mark.timeout(60)

MAX_REQUEST = 65536
API_PRODUCE, API_FETCH, API_LIST_OFFSETS, API_METADATA = 0, 1, 2, 3
API_VERSIONS, API_CREATE_TOPICS, API_INIT_PRODUCER_ID = 18, 19, 22


@pytest.fixture(scope="module")
def module_broker_config() -> dict[str, str]:
    return {"socket.request.max.bytes": str(MAX_REQUEST)}


@pytest.fixture
def sb(module_broker: Broker) -> Broker:
    return module_broker


def assert_still_serving(broker: Broker) -> None:
    """A new connection gets ApiVersions and Metadata answered."""
    assert broker.running, f"broker died (exit code {broker.returncode})"
    with WireClient(broker.bootstrap) as c:
        versions = c.send(ApiVersionsV3(client_software_name="t", client_software_version="1"))
        assert versions.error_code == 0
        md = c.send(MetadataV1(topics=None))
        assert len(md.brokers) == 1


def _versions(broker: Broker) -> dict[int, tuple[int, int]]:
    with WireClient(broker.bootstrap) as c:
        resp = c.send(ApiVersionsV3(client_software_name="t", client_software_version="1"))
    assert resp.error_code == 0
    return {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in resp.api_keys}


# ---------------------------------------------------------------------------- ApiVersions
def test_api_versions_advertises_planned_apis(sb: Broker) -> None:
    versions = _versions(sb)
    # librdkafka only uses magic-2 batches if Produce >= 3 and Fetch >= 4 are advertised
    for key, needed in (
        (API_PRODUCE, 3),
        (API_FETCH, 4),
        (API_LIST_OFFSETS, 1),
        (API_METADATA, 1),
        (API_VERSIONS, 3),
        (API_CREATE_TOPICS, 4),
        (API_INIT_PRODUCER_ID, 0),
    ):
        assert key in versions, f"API {key} not advertised"
        lo, hi = versions[key]
        assert lo <= needed <= hi, f"API {key}: v{needed} not in advertised range {lo}..{hi}"
    with WireClient(sb.bootstrap) as c:  # v0 too (aiokafka uses it)
        v0 = c.send(ApiVersionsV0())
    assert v0.error_code == 0
    assert {int(k.api_key) for k in v0.api_keys} == set(versions)


def test_api_versions_unknown_version_gets_v0_error_with_supported_list(sb: Broker) -> None:
    with WireClient(sb.bootstrap) as c:
        c.send_frame(raw_request(API_VERSIONS, 99, correlation_id=7, body=b"\x00\x00\x00"))
        payload = c.recv_frame()
        corr, resp = parse_response(ApiVersionsResponseV0, payload, header_v1=False)
        assert corr == 7
        assert resp.error_code == 35  # UNSUPPORTED_VERSION
        keys = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in resp.api_keys}
        assert API_VERSIONS in keys and keys[API_VERSIONS][1] >= 3
        assert API_PRODUCE in keys
        # the connection stays usable: the client retries with a version from the list
        assert c.send(ApiVersionsV3(client_software_name="t", client_software_version="1")).error_code == 0
    assert_still_serving(sb)


# ---------------------------------------------------------------------------- framing
def test_garbage_frame_closes_connection(sb: Broker) -> None:
    with WireClient(sb.bootstrap) as c:
        c.send_frame(os.urandom(3))  # too short to hold a request header
        assert c.is_closed()
    with WireClient(sb.bootstrap) as c:
        c.send_frame(b"\xff" * 64)  # api key -1
        assert c.is_closed()
    assert_still_serving(sb)


def test_truncated_request_body_closes_connection(sb: Broker) -> None:
    with WireClient(sb.bootstrap) as c:
        # a Produce v3 header followed by half a body: topic array claims 5 entries
        c.send_frame(
            raw_request(API_PRODUCE, 3, 1, body=b"\xff\xff\x00\x01\x00\x00\x27\x10\x00\x00\x00\x05\x00")
        )
        assert c.is_closed()
    with WireClient(sb.bootstrap) as c:
        c.send_frame(
            raw_request(API_METADATA, 1, 1, body=b"\x00\x00\x00\x02\x00\x50zz")
        )  # string longer than frame
        assert c.is_closed()
    assert_still_serving(sb)


def test_oversized_frame_closes_connection(sb: Broker) -> None:
    with WireClient(sb.bootstrap) as c:
        c.send_raw(struct.pack(">i", MAX_REQUEST + 1) + b"\x00" * 1024)  # the size alone condemns it
        assert c.is_closed()
    with WireClient(sb.bootstrap) as c:
        c.send_raw(struct.pack(">i", 2**31 - 1))
        assert c.is_closed()
    with WireClient(sb.bootstrap) as c:
        c.send_raw(struct.pack(">i", -5))
        assert c.is_closed()
    assert_still_serving(sb)


def test_frame_just_under_limit_is_accepted(sb: Broker, topic: str) -> None:
    with WireClient(sb.bootstrap) as c:
        assert create_topic(c, topic).error_code == 0
        batch = simple_batch([b"x" * (MAX_REQUEST - 1024)])
        resp = c.send(produce_request(topic, 0, batch))
        assert partition_response(resp).error_code == 0


def test_unknown_api_key_closes_connection(sb: Broker) -> None:
    with WireClient(sb.bootstrap) as c:
        c.send_frame(raw_request(9999, 0, 1))
        assert c.is_closed()
    with WireClient(
        sb.bootstrap
    ) as c:  # a real key this broker does not serve (e.g. 68, ConsumerGroupHeartbeat)
        versions = _versions(sb)
        unserved = next(k for k in range(100) if k not in versions)
        c.send_frame(raw_request(unserved, 0, 1))
        assert c.is_closed()
    assert_still_serving(sb)


def test_unsupported_version_of_other_api_closes_connection(sb: Broker) -> None:
    """Kafka parses the header, cannot parse a Metadata v99 body, and closes the connection."""
    with WireClient(sb.bootstrap) as c:
        c.send_frame(raw_request(API_METADATA, 99, 1, body=b"\x00\x00\x00\x00"))
        assert c.is_closed()
    assert_still_serving(sb)


# ---------------------------------------------------------------------------- record validation
def test_unknown_tagged_fields_are_skipped_as_kafka_does(sb: Broker) -> None:
    """A newer client may send tags this broker's schema predates; Kafka skips them."""
    from kio.schema.find_coordinator.v4.response import FindCoordinatorResponse

    # FindCoordinator v4: key_type=0 (group), keys=["g-tags"], then 2 unknown tags (99, 100)
    body = b"\x00" + b"\x02" + b"\x07g-tags" + b"\x02" + b"\x63\x02\xab\xcd" + b"\x64\x00"
    with WireClient(sb.bootstrap) as c:
        c.send_frame(raw_request(10, 4, correlation_id=11, body=body, flexible=True))
        corr, resp = parse_response(FindCoordinatorResponse, c.recv_frame(), header_v1=True)
        assert corr == 11
        assert [(k.key, k.error_code) for k in resp.coordinators] == [("g-tags", 0)]
    assert_still_serving(sb)


def test_corrupt_crc_is_rejected_with_corrupt_message(sb: Broker, topic: str) -> None:
    with WireClient(sb.bootstrap) as c:
        assert create_topic(c, topic).error_code == 0
        good = simple_batch([b"first"])
        assert partition_response(c.send(produce_request(topic, 0, good))).error_code == 0
        assert log_end_offset(c, topic) == 1

        batch = bytearray(simple_batch([b"hello", b"world"]))
        batch[-3] ^= 0xFF  # a record byte: covered by the CRC32C
        part = partition_response(c.send(produce_request(topic, 0, bytes(batch))))
        assert part.error_code == 2  # CORRUPT_MESSAGE
        assert log_end_offset(c, topic) == 1

        batch = bytearray(simple_batch([b"hello"]))
        batch[17] ^= 0x01  # the stored CRC itself
        part = partition_response(c.send(produce_request(topic, 0, bytes(batch))))
        assert part.error_code == 2
        assert log_end_offset(c, topic) == 1

        # the connection is still fine and a good batch goes in after the bad ones
        part = partition_response(c.send(produce_request(topic, 0, simple_batch([b"after"]))))
        assert part.error_code == 0
        assert int(part.base_offset) == 1
    assert_still_serving(sb)


def test_bad_batch_length_and_magic_are_rejected(sb: Broker, topic: str) -> None:
    with WireClient(sb.bootstrap) as c:
        assert create_topic(c, topic).error_code == 0
        batch = bytearray(simple_batch([b"abc"]))
        struct.pack_into(">i", batch, 8, len(batch) + 100)  # batchLength beyond the data
        part = partition_response(c.send(produce_request(topic, 0, bytes(batch))))
        assert part.error_code != 0

        batch = bytearray(simple_batch([b"abc"]))
        batch[16] = 1  # magic 1 in a Produce v3+ request
        part = partition_response(c.send(produce_request(topic, 0, bytes(batch))))
        assert part.error_code in (2, 43, 87), (
            part
        )  # CORRUPT_MESSAGE / UNSUPPORTED_FOR_MESSAGE_FORMAT / INVALID_RECORD
        part = partition_response(c.send(produce_request(topic, 0, b"\x00" * 30)))  # shorter than a header
        assert part.error_code != 0
        assert log_end_offset(c, topic) == 0
    assert_still_serving(sb)


def test_produce_to_unknown_topic_and_partition(sb: Broker, topic: str) -> None:
    with WireClient(sb.bootstrap) as c:
        assert create_topic(c, topic).error_code == 0
        part = partition_response(c.send(produce_request(topic, 3, simple_batch([b"x"]))))
        assert part.error_code == 3  # UNKNOWN_TOPIC_OR_PARTITION
        # Produce never creates topics (only Metadata does, when allowed)
        missing = topic + "-missing"
        part = partition_response(c.send(produce_request(missing, 0, simple_batch([b"x"]))))
        assert part.error_code == 3
        md = c.send(MetadataV1(topics=None))
        assert missing not in {t.name for t in md.topics}
    assert_still_serving(sb)


@pytest.mark.parametrize(("producer_id", "producer_epoch"), [(-1, 0), (1000, -1)])
def test_txn_marker_without_a_producer_is_refused_and_writes_nothing(
    sb: Broker, topic: str, producer_id: int, producer_epoch: int
) -> None:
    """WriteTxnMarkers for a marker with no producer (negative id or epoch): INVALID_REQUEST on its
    partition, nothing appended, the connection stays open (it used to be closed on an internal
    error from the producer state)."""
    with WireClient(sb.bootstrap) as c:
        assert create_topic(c, topic).error_code == 0
        before = log_end_offset(c, topic, 0)
        marker = wm.WritableTxnMarker(
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            transaction_result=True,
            topics=(wm.WritableTxnMarkerTopic(name=topic, partition_indexes=(0,)),),
            coordinator_epoch=0,
        )
        response = c.send(wm.WriteTxnMarkersRequest(markers=(marker,)))
        (result,) = response.markers
        assert [int(p.error_code) for t in result.topics for p in t.partitions] == [42]  # INVALID_REQUEST
        assert log_end_offset(c, topic, 0) == before
    assert_still_serving(sb)
