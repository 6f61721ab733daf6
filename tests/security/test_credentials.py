"""The SCRAM credential file: persisted atomically, private, keys only."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from exactly.security.credentials import CredentialStore, CredentialStoreError
from exactly.security.scram import ScramMechanism, credential_from_password

SHA512 = ScramMechanism.SCRAM_SHA_512


def test_changes_survive_a_reopen_and_the_file_holds_no_password(tmp_path: Path) -> None:
    store = CredentialStore.in_dir(tmp_path)
    cred = credential_from_password(SHA512, "very-secret-password", 4096)
    store.apply([("alice", SHA512, cred)], [])
    again = CredentialStore.in_dir(tmp_path)
    assert again.lookup("alice", SHA512) == cred
    assert again.lookup("alice", ScramMechanism.SCRAM_SHA_256) is None
    assert b"very-secret-password" not in store.path.read_bytes()
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    again.apply([], [("alice", SHA512)])
    assert CredentialStore.in_dir(tmp_path).users() == {}


def test_unreadable_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "scram-credentials.json").write_text("{not json")
    with pytest.raises(CredentialStoreError):
        CredentialStore.in_dir(tmp_path)
