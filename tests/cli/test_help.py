"""Every command's and sub-command's ``--help`` ends with an Example section; ``--version``
prints the installed version from the package metadata."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

from exactly.cli.examples import walk
from exactly.cli.main import build_parser
from tests.support.broker import child_env

COMMANDS = [path for path, _parser in walk(build_parser())]


def test_every_command_is_walked() -> None:
    # the walk reaches sub-commands, not only the top level (a walk that stops early passes vacuously)
    assert {"", "serve", "topics describe", "txn list", "groups describe", "pipeline run"} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c or "exactly")
def test_help_has_an_example(command: str) -> None:
    words = command.split()
    parser = build_parser(words[0] if words else None)
    helps = dict(walk(parser))
    text = helps[command].format_help()
    assert "\nExample:\n" in text, text
    example = text.split("\nExample:\n", 1)[1]
    assert f"exactly {command}".strip() in example, example


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exactly", *args], capture_output=True, text=True, env=child_env(), timeout=60
    )


def test_help_from_the_command_line_keeps_the_example_as_written() -> None:
    proc = run("produce", "--help")
    assert proc.returncode == 0, proc.stderr
    example = proc.stdout.split("\nExample:\n", 1)[1].splitlines()
    assert example[0] == "  printf 'k1:hello\\nk2:world\\n' | exactly produce orders --key-separator :"


def test_version_is_the_installed_distributions() -> None:
    proc = run("--version")
    assert proc.returncode == 0, proc.stderr
    try:
        expected = importlib.metadata.version("exactly")
    except importlib.metadata.PackageNotFoundError:
        expected = "(source tree, not installed)"
    assert proc.stdout.startswith("exactly ") and expected in proc.stdout, proc.stdout
    assert proc.stderr == ""
