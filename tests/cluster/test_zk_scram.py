"""Kafka's /config/users node format for SCRAM credentials (no ZooKeeper needed)."""

from __future__ import annotations

import pytest

from exactly.cluster.zk_scram import (
    ScramZnodeError,
    credentials_of,
    decode_scram,
    decode_user_config,
    encode_scram,
    encode_user_config,
)
from exactly.security.scram import ScramMechanism, credential_from_password


def test_round_trip_in_kafkas_format_keeping_other_configs() -> None:
    cred = credential_from_password(ScramMechanism.SCRAM_SHA_256, "pw", 8192, b"0123456789abcdef")
    text = encode_scram(cred)
    assert text.startswith("salt=MDEyMzQ1Njc4OWFiY2RlZg==,stored_key=") and text.endswith(",iterations=8192")
    assert decode_scram(text) == cred
    data = encode_user_config({"SCRAM-SHA-256": text, "producer_byte_rate": "1024"})
    assert data.startswith(b'{"version":1,"config":{')
    config = decode_user_config(data)
    assert config["producer_byte_rate"] == "1024"
    assert credentials_of(config) == {ScramMechanism.SCRAM_SHA_256: cred}


@pytest.mark.parametrize("data", [b"nope", b'{"version":1}', b"[]"])
def test_unreadable_nodes_are_errors(data: bytes) -> None:
    with pytest.raises(ScramZnodeError):
        decode_user_config(data)
    with pytest.raises(ScramZnodeError):
        decode_scram("salt=!!,stored_key=,server_key=,iterations=x")
