"""``--command-config`` / ``-X``: the properties format of Kafka's tools and the merged dict."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from exactly.cli.security_options import add_security_options, parse_properties, security_config
from exactly.testing.broker import child_env


def test_properties_with_comments_separators_and_continuations() -> None:
    text = (
        "# comment\n! also\n\n"
        "security.protocol = SASL_SSL\n"
        "sasl.mechanism: SCRAM-SHA-256\n"
        "ssl.ca.location /etc/ca.pem\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \\\n"
        '    username="u" \\\n'
        '    password="p=q";\n'
    )
    assert parse_properties(text) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-256",
        "ssl.ca.location": "/etc/ca.pem",
        "sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="p=q";',
    }


def test_x_overrides_the_file_and_bootstrap_comes_from_the_command_line(tmp_path: Path) -> None:
    props = tmp_path / "c.properties"
    props.write_text(
        "bootstrap.servers=elsewhere:9092\nsecurity.protocol=SSL\n"
        'sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="p";\n'
    )
    parser = argparse.ArgumentParser()
    add_security_options(parser)
    args = parser.parse_args(["--command-config", str(props), "-X", "security.protocol=SASL_SSL"])
    assert security_config(args) == {
        "security.protocol": "SASL_SSL",
        "sasl.username": "u",
        "sasl.password": "p",
    }


def test_unreadable_command_config_is_one_line_exit_1(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "exactly", "txn", "list", "--command-config", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert done.returncode == 1
    assert "cannot read" in done.stderr and "Traceback" not in done.stderr


def test_unusable_setting_is_one_line_exit_1() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "exactly", "txn", "list", "-X", "security.protocol=SASL_SSL"],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "exactly txn list: error: sasl.mechanism must be one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 "
        "for SASL_SSL, got nothing"
    )
