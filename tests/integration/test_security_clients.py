"""TLS and SASL with kafka-python, aiokafka and kcat (SCRAM-SHA-512 over SASL_SSL, client
certificates over SSL, transactional copies), and the ``exactly users`` command."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from tests.support.broker import Broker
from tests.support.certs import TestPki
from tests.support.clients import create_topic, produce_values
from tests.support.security import (
    ALICE_PW,
    read_values,
    scram_conf,
    users_cli,
)
from tests.support.security_fixtures import (  # noqa: F401  (fixtures: pki, module_broker_config, _alice, sb)
    alice_fixture,
    pki_fixture,
    secured_broker_config_fixture,
    secured_broker_fixture,
)

pytestmark = pytest.mark.timeout(120)


# ------------------------------------------------------------------ the users command
def test_users_command_adds_lists_and_deletes_scram_credentials(sb: Broker, pki: TestPki) -> None:
    done = users_cli(
        sb,
        "add",
        "carol",
        "--password-stdin",
        "--mechanism",
        "SCRAM-SHA-256",
        "--iterations",
        "8192",
        stdin="carol-pw\n",
    )
    assert done.returncode == 0, done.stderr
    listing = users_cli(sb, "list")
    assert listing.returncode == 0, listing.stderr
    assert "carol\tSCRAM-SHA-256\t8192" in listing.stdout.replace("  ", "\t") or any(
        line.split() == ["carol", "SCRAM-SHA-256", "8192"] for line in listing.stdout.splitlines()
    )
    stored = (sb.data_dir / "scram-credentials.json").read_text()
    assert "carol-pw" not in stored and "carol" in stored
    conf = {**scram_conf(sb, pki, user="carol", password="carol-pw"), "sasl.mechanism": "SCRAM-SHA-256"}
    assert AdminClient(conf).list_topics(timeout=10).brokers
    bad = users_cli(sb, "add", "dave", "--password", "x", "--iterations", "100")
    assert bad.returncode == 1 and "UNACCEPTABLE_CREDENTIAL" in bad.stderr
    gone = users_cli(sb, "delete", "carol")
    assert gone.returncode == 0, gone.stderr
    assert not any(line.split()[:1] == ["carol"] for line in users_cli(sb, "list").stdout.splitlines())
    missing = users_cli(sb, "delete", "carol", "--mechanism", "SCRAM-SHA-256")
    assert missing.returncode == 1 and "RESOURCE_NOT_FOUND" in missing.stderr
    with pytest.raises(KafkaException):
        AdminClient({**conf, "error_cb": lambda e: None}).list_topics(timeout=3)


# ------------------------------------------------------------------ kafka-python and aiokafka
def test_kafka_python_scram_and_client_certificate(sb: Broker, pki: TestPki, topic: str) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    confs = {
        "SASL_SSL": {
            "bootstrap_servers": sb.listener_address("SASL_SSL"),
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_plain_username": "alice",
            "sasl_plain_password": ALICE_PW,
            "ssl_cafile": str(pki.ca),
        },
        "SSL": {
            "bootstrap_servers": sb.listener_address("SSL"),
            "security_protocol": "SSL",
            "ssl_cafile": str(pki.ca),
            "ssl_certfile": str(pki.alice.cert),
            "ssl_keyfile": str(pki.alice.key),
        },
    }
    for name, conf in confs.items():
        p = KafkaProducer(**conf, max_block_ms=15_000)
        for i in range(5):
            p.send(topic, f"{name}-{i}".encode())
        p.flush(15)
        p.close()
    for conf in confs.values():
        c = KafkaConsumer(
            topic, **conf, auto_offset_reset="earliest", consumer_timeout_ms=10_000, group_id=None
        )
        values = [m.value for m in c]
        c.close()
        assert sorted(values) == sorted(f"{n}-{i}".encode() for n in confs for i in range(5))


def test_kafka_python_transactional_copy_over_scram(
    sb: Broker, pki: TestPki, unique_name: Callable[[str], str]
) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.structs import OffsetAndMetadata
    from kafka.structs import TopicPartition as KTopicPartition

    conf = {
        "bootstrap_servers": sb.listener_address("SASL_SSL"),
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "alice",
        "sasl_plain_password": ALICE_PW,
        "ssl_cafile": str(pki.ca),
    }
    src, dst, group = unique_name("kp-in"), unique_name("kp-out"), unique_name("kp-g")
    produce_values(sb.listener_address("PLAINTEXT"), src, [f"x{i}".encode() for i in range(6)])
    create_topic(sb.listener_address("PLAINTEXT"), dst)
    c = KafkaConsumer(
        src,
        **conf,
        group_id=group,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    p = KafkaProducer(**conf, transactional_id=f"{group}-tx", max_block_ms=15_000)
    try:
        p.init_transactions()
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while len(got) < 6 and time.monotonic() < deadline:
            for recs in c.poll(500).values():
                got += recs
        assert len(got) == 6
        p.begin_transaction()
        for r in got:
            p.send(dst, b"out-" + r.value)
        p.send_offsets_to_transaction(
            {KTopicPartition(src, 0): OffsetAndMetadata(got[-1].offset + 1, "", -1)}, c.group_metadata()
        )
        p.commit_transaction()
    finally:
        c.close()
        p.close(timeout=5)
    plain = {"bootstrap.servers": sb.listener_address("PLAINTEXT")}
    assert sorted(read_values(plain, dst, 6)) == sorted(f"out-x{i}".encode() for i in range(6))


def test_aiokafka_scram_transactional_copy_and_client_certificate(
    sb: Broker, pki: TestPki, unique_name: Callable[[str], str]
) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.helpers import create_ssl_context
    from aiokafka.structs import OffsetAndMetadata
    from aiokafka.structs import TopicPartition as ATopicPartition

    scram = {
        "bootstrap_servers": sb.listener_address("SASL_SSL"),
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "alice",
        "sasl_plain_password": ALICE_PW,
        "ssl_context": create_ssl_context(cafile=str(pki.ca)),
    }
    mtls = {
        "bootstrap_servers": sb.listener_address("SSL"),
        "security_protocol": "SSL",
        "ssl_context": create_ssl_context(
            cafile=str(pki.ca), certfile=str(pki.alice.cert), keyfile=str(pki.alice.key)
        ),
    }
    src, dst, group = unique_name("aio-in"), unique_name("aio-out"), unique_name("aio-g")
    create_topic(sb.listener_address("PLAINTEXT"), src)
    create_topic(sb.listener_address("PLAINTEXT"), dst)

    async def main() -> list[bytes]:
        p = AIOKafkaProducer(**mtls)  # produce the input over SSL with the client certificate
        await p.start()
        try:
            for i in range(6):
                await p.send_and_wait(src, f"a{i}".encode())
        finally:
            await p.stop()
        c = AIOKafkaConsumer(
            src,
            **scram,
            group_id=group,
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        tp = AIOKafkaProducer(**scram, transactional_id=f"{group}-tx")
        await c.start()
        await tp.start()
        try:
            got: list[Any] = []
            deadline = time.monotonic() + 30
            while len(got) < 6 and time.monotonic() < deadline:
                for recs in (await c.getmany(timeout_ms=200)).values():
                    got += recs
            assert len(got) == 6
            async with tp.transaction():
                for r in got:
                    await tp.send(dst, b"out-" + r.value)
                await tp.send_offsets_to_transaction(
                    {ATopicPartition(src, 0): OffsetAndMetadata(got[-1].offset + 1, "")}, group
                )
        finally:
            await tp.stop()
            await c.stop()
        reader = AIOKafkaConsumer(dst, **mtls, isolation_level="read_committed", auto_offset_reset="earliest")
        await reader.start()
        try:
            out: list[bytes] = []
            deadline = time.monotonic() + 30
            while len(out) < 6 and time.monotonic() < deadline:
                for recs in (await reader.getmany(timeout_ms=200)).values():
                    out += [r.value for r in recs]
            return out
        finally:
            await reader.stop()

    assert sorted(asyncio.run(main())) == sorted(f"out-a{i}".encode() for i in range(6))


# ------------------------------------------------------------------ kcat
def test_kcat_over_sasl_ssl_and_ssl(kcat: str, sb: Broker, pki: TestPki, topic: str, tmp_path: Path) -> None:
    scram = [
        "-X",
        "security.protocol=SASL_SSL",
        "-X",
        "sasl.mechanisms=SCRAM-SHA-512",
        "-X",
        "sasl.username=alice",
        "-X",
        f"sasl.password={ALICE_PW}",
        "-X",
        f"ssl.ca.location={pki.ca}",
    ]
    mtls = [
        "-X",
        "security.protocol=SSL",
        "-X",
        f"ssl.ca.location={pki.ca}",
        "-X",
        f"ssl.certificate.location={pki.alice.cert}",
        "-X",
        f"ssl.key.location={pki.alice.key}",
    ]
    for address, opts, lines in (
        (sb.listener_address("SASL_SSL"), scram, b"s1\ns2\n"),
        (sb.listener_address("SSL"), mtls, b"m1\nm2\n"),
    ):
        done = subprocess.run(
            [kcat, "-b", address, *opts, "-P", "-t", topic], input=lines, capture_output=True, timeout=60
        )
        assert done.returncode == 0, done.stderr.decode()
    for address, opts in ((sb.listener_address("SASL_SSL"), scram), (sb.listener_address("SSL"), mtls)):
        done = subprocess.run(
            [kcat, "-b", address, *opts, "-C", "-t", topic, "-o", "beginning", "-c", "4", "-e"],
            capture_output=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr.decode()
        assert sorted(done.stdout.split()) == [b"m1", b"m2", b"s1", b"s2"]
