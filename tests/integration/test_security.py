"""TLS and SASL with confluent-kafka against one broker with four listeners (see
tests/support/security.py): produce, consume and a transactional consume-transform-produce over
SASL_SSL (SCRAM-SHA-512) and SSL (client certificates); refusals (wrong password, unknown user,
bad certificates, plaintext clients and garbage on TLS ports) that leave the broker serving;
the SASL state machine seen on the wire; start-up refusals of unusable settings."""

from __future__ import annotations

import socket
import ssl
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v3.request import FindCoordinatorRequest
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

from exactly.testing.broker import child_env
from exactly.testing.wait import wait_until
from tests.support.broker import Broker
from tests.support.certs import TestPki
from tests.support.clients import create_topic
from tests.support.security import (
    ALICE_PW,
    failed_auth_total,
    read_values,
    scram_conf,
    ssl_conf,
)
from tests.support.security_fixtures import (  # noqa: F401  (fixtures: pki, module_broker_config, _alice, sb)
    alice_fixture,
    pki_fixture,
    secured_broker_config_fixture,
    secured_broker_fixture,
)
from tests.support.wire import ConnectionClosed, WireClient, encode_request

pytestmark = pytest.mark.timeout(120)


# ------------------------------------------------------------------ confluent-kafka
def consume_transform_produce(conf: dict[str, Any], src: str, dst: str, group: str, n: int) -> None:
    """Read ``n`` records of ``src`` read_committed, write them to ``dst`` in one transaction
    that also commits the group's offsets."""
    consumer = Consumer(
        {
            **conf,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    producer = Producer({**conf, "transactional.id": f"{group}-tx", "linger.ms": 5})
    try:
        producer.init_transactions(30)
        consumer.subscribe([src])
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            for m in consumer.consume(n - len(got), 0.5):
                assert m.error() is None, m.error()
                got.append(m)
        assert len(got) == n
        producer.begin_transaction()
        for m in got:
            producer.produce(dst, b"out-" + m.value(), partition=m.partition())
        ends = {m.partition(): m.offset() + 1 for m in got}
        producer.send_offsets_to_transaction(
            [TopicPartition(src, p, o) for p, o in ends.items()], consumer.consumer_group_metadata(), 30
        )
        producer.commit_transaction(30)
        committed = consumer.committed([TopicPartition(src, p) for p in ends], timeout=10)
        assert {tp.partition: tp.offset for tp in committed} == ends
    finally:
        consumer.close()


@pytest.mark.parametrize("transport", ["SASL_SSL", "SSL"])
def test_confluent_produce_consume_and_consume_transform_produce(
    sb: Broker, pki: TestPki, unique_name: Callable[[str], str], transport: str
) -> None:
    conf = scram_conf(sb, pki) if transport == "SASL_SSL" else ssl_conf(sb, pki)
    src, dst = unique_name("sec-in"), unique_name("sec-out")
    for t in (src, dst):
        create_topic(sb.listener_address("PLAINTEXT"), t, partitions=2)
    # the cluster seen through this listener: its own endpoint
    md = AdminClient(conf).list_topics(timeout=10)
    host, port = conf["bootstrap.servers"].rsplit(":", 1)
    assert [(b.host, b.port) for b in md.brokers.values()] == [(host, int(port))]
    p = Producer(conf)
    for i in range(10):
        p.produce(src, f"v{i}".encode(), partition=i % 2)
    assert p.flush(15) == 0
    consume_transform_produce(conf, src, dst, unique_name("sec-g"), 10)
    assert Counter(read_values(conf, dst, 10)) == Counter(f"out-v{i}".encode() for i in range(10))


def test_wrong_password_and_unknown_user_are_refused_alike_and_counted(sb: Broker, pki: TestPki) -> None:
    before = failed_auth_total(sb)
    messages = []
    for user, password in (("alice", "wrong"), ("nobody", ALICE_PW)):
        errors: list[Any] = []
        admin = AdminClient({**scram_conf(sb, pki, user=user, password=password), "error_cb": errors.append})
        with pytest.raises(KafkaException):
            admin.list_topics(timeout=3)
        admin.poll(1)  # error_cb runs from poll
        auth_errors = [e.str() for e in errors if "Authentication failed" in e.str()]
        assert auth_errors, [e.str() for e in errors]
        messages.append(auth_errors[0].split(": ", 1)[-1].split(" (after")[0])
    assert messages[0] == messages[1]
    assert "invalid credentials" in messages[0]
    assert failed_auth_total(sb) >= before + 2
    log = sb.log_text()
    assert "authentication failed: listener=SASL_SSL" in log
    assert ALICE_PW not in log and "wrong" not in log.split("authentication failed")[-1][:200]
    # the broker serves others as before
    assert AdminClient(scram_conf(sb, pki)).list_topics(timeout=10).brokers


@pytest.mark.parametrize("which", ["expired", "untrusted", "none"])
def test_bad_client_certificates_are_refused_and_the_broker_serves_on(
    sb: Broker, pki: TestPki, which: str
) -> None:
    conf = ssl_conf(sb, pki, pki.expired if which == "expired" else pki.untrusted)
    if which == "none":
        conf = {k: v for k, v in conf.items() if k not in ("ssl.certificate.location", "ssl.key.location")}
    before = failed_auth_total(sb)
    admin = AdminClient({**conf, "error_cb": lambda e: None})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=3)
    assert AdminClient(ssl_conf(sb, pki)).list_topics(timeout=10).brokers
    # failed TLS handshakes are counted and audited (Kafka's failed-authentication-total)
    wait_until(lambda: failed_auth_total(sb) > before, 10, "a failed TLS handshake counted")
    assert "TLS handshake did not complete" in sb.log_text()


def test_plaintext_client_on_tls_ports_is_refused_cleanly(sb: Broker, pki: TestPki) -> None:
    request = encode_request(ApiVersionsRequest(client_software_name="t", client_software_version="1"), 1)
    api_versions = len(request).to_bytes(4, "big") + request
    for name in ("SSL", "SASL_SSL"):
        host, port = sb.listener_address(name).rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(api_versions)
            data = _read_until_closed(s)
        assert not data.startswith(b"\x00\x00"), "a Kafka response on a TLS port"
        admin = AdminClient({"bootstrap.servers": sb.listener_address(name), "error_cb": lambda e: None})
        with pytest.raises(KafkaException):
            admin.list_topics(timeout=3)
    assert AdminClient(scram_conf(sb, pki)).list_topics(timeout=10).brokers
    assert AdminClient(ssl_conf(sb, pki)).list_topics(timeout=10).brokers


def test_garbage_on_tls_ports_does_not_hurt_the_broker(sb: Broker, pki: TestPki) -> None:
    import random

    rng = random.Random(13)
    for name in ("SSL", "SASL_SSL"):
        host, port = sb.listener_address(name).rsplit(":", 1)
        for i in range(20):
            with socket.create_connection((host, int(port)), timeout=10) as s:
                blob = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 2000)))
                if i % 4 == 0:  # a TLS record header in front of the garbage
                    blob = b"\x16\x03\x01" + blob
                s.sendall(blob)
                _read_until_closed(s, wait=5)
        # a TLS session that then speaks garbage inside
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        ctx.load_cert_chain(str(pki.alice.cert), str(pki.alice.key))
        with (
            socket.create_connection((host, int(port)), timeout=10) as raw,
            ctx.wrap_socket(raw, server_hostname="localhost") as s,
        ):
            s.sendall(b"\x00\x00\x00\x08garbage!")
            try:
                _read_until_closed(s, wait=5)
            except (ssl.SSLError, OSError):
                pass
    assert AdminClient(scram_conf(sb, pki)).list_topics(timeout=10).brokers
    assert AdminClient(ssl_conf(sb, pki)).list_topics(timeout=10).brokers


def _read_until_closed(s: socket.socket, wait: float = 10) -> bytes:
    s.settimeout(wait)
    out = bytearray()
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
    except (ConnectionResetError, TimeoutError, BrokenPipeError):
        pass
    return bytes(out)


# ------------------------------------------------------------------ the wire, on SASL_PLAINTEXT
def _metadata() -> MetadataRequest:
    return MetadataRequest(
        topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )


def test_requests_before_authentication_are_not_served(sb: Broker) -> None:
    address = sb.listener_address("SASL_PLAINTEXT")
    with WireClient(address) as wc:  # first request neither ApiVersions nor SaslHandshake
        wc.send_frame(encode_request(_metadata(), 1))
        with pytest.raises(ConnectionClosed):
            wc.recv_frame()
    with WireClient(address) as wc:  # handshake, then another API instead of SaslAuthenticate
        assert wc.send(SaslHandshakeRequest(mechanism="PLAIN")).error_code == ErrorCode.none
        wc.send_frame(encode_request(_metadata(), 9))
        with pytest.raises(ConnectionClosed):
            wc.recv_frame()
    with WireClient(address) as wc:  # failed authentication: answered, then nothing more
        wc.send(SaslHandshakeRequest(mechanism="PLAIN"))
        answer = wc.send(SaslAuthenticateRequest(auth_bytes=b"\x00bob\x00nope"))
        assert answer.error_code == ErrorCode.sasl_authentication_failed
        wc.send_frame(encode_request(_metadata(), 99))
        with pytest.raises(ConnectionClosed):
            wc.recv_frame()
    with WireClient(address) as wc:
        answer = wc.send(SaslHandshakeRequest(mechanism="GSSAPI"))
        assert answer.error_code == ErrorCode.unsupported_sasl_mechanism
        assert set(answer.mechanisms) == {"SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"}
        assert wc.is_closed()


def test_authenticated_connection_gets_its_listener_endpoints(sb: Broker) -> None:
    address = sb.listener_address("SASL_PLAINTEXT")
    port = sb.listener_ports["SASL_PLAINTEXT"]
    with WireClient(address) as wc:
        wc.send(SaslHandshakeRequest(mechanism="PLAIN"))
        assert (
            wc.send(SaslAuthenticateRequest(auth_bytes=b"bob\x00bob\x00bob-pw")).error_code == ErrorCode.none
        )
        md = wc.send(_metadata())
        assert [(b.host, b.port) for b in md.brokers] == [("127.0.0.1", port)]
        coordinator = wc.send(FindCoordinatorRequest(key="g", key_type=0))
        assert coordinator.error_code == ErrorCode.none and coordinator.port == port
        # a second handshake on an authenticated connection: ILLEGAL_SASL_STATE (no re-authentication)
        assert wc.send(SaslHandshakeRequest(mechanism="PLAIN")).error_code == ErrorCode.illegal_sasl_state
    with WireClient(sb.listener_address("PLAINTEXT")) as wc:
        md = wc.send(_metadata())
        assert [b.port for b in md.brokers] == [sb.listener_ports["PLAINTEXT"]]
        assert wc.send(SaslHandshakeRequest(mechanism="PLAIN")).error_code == ErrorCode.illegal_sasl_state


# ------------------------------------------------------------------ start-up refusals
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"listeners": "SSL://127.0.0.1:0"}, "ssl.keystore.location"),
        ({"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": "GSSAPI"}, "not supported"),
        (
            {"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": "PLAIN"},
            "plain.sasl.jaas.config",
        ),
        ({"listeners": "CLIENT://127.0.0.1:0"}, "listener.security.protocol.map"),
        ({"listeners": "SSL://127.0.0.1:0", "ssl.keystore.location": "/nonexistent.pem"}, "cannot load"),
    ],
)
def test_unusable_security_settings_refuse_to_start(
    tmp_path: Path, overrides: dict[str, str], message: str
) -> None:
    from exactly.testing.broker import serve_command

    done = subprocess.run(
        serve_command(tmp_path / "data", overrides=overrides),
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr


def test_random_frames_before_authentication_get_only_sasl_answers(sb: Broker) -> None:
    """Connection-level fuzz on SASL_PLAINTEXT: whatever comes before authentication, the only
    answers are ApiVersions, SaslHandshake or SaslAuthenticate ones, and the broker lives on."""
    import random
    import struct

    rng = random.Random(1313)
    address = sb.listener_address("SASL_PLAINTEXT")
    allowed_first = {18, 17, 36}
    for _ in range(40):
        with WireClient(address, timeout=5) as wc:
            sent: dict[int, int] = {}
            for i in range(rng.randint(1, 4)):
                key = rng.choice([0, 1, 3, 17, 18, 22, 36, 999])
                corr = 1000 + i
                sent[corr] = key
                body = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 60)))
                try:
                    wc.send_frame(struct.pack(">hhih", key, rng.randint(0, 4), corr, -1) + body)
                except OSError:  # closed already: the broker refused an earlier frame
                    break
            try:
                while True:
                    frame = wc.recv_frame()
                    (corr,) = struct.unpack_from(">i", frame)
                    assert sent.get(corr) in allowed_first, (
                        f"answered API {sent.get(corr)} before authentication"
                    )
            except (ConnectionClosed, TimeoutError, OSError):
                pass
    with WireClient(address) as wc:
        wc.send(SaslHandshakeRequest(mechanism="PLAIN"))
        assert wc.send(SaslAuthenticateRequest(auth_bytes=b"\x00bob\x00bob-pw")).error_code == ErrorCode.none
