"""The SCRAM credential store of a single broker: ``<data-dir>/scram-credentials.json``.

Holds per user and mechanism only what SCRAM needs (salt, StoredKey, ServerKey, iterations;
base64 in the file, Kafka's ZooKeeper fields under the same names), never a password. Every
change rewrites the file with ``write_durably`` (temp file, fsync, rename, fsync of the
directory), so a crash leaves the old or the new set. The file is created mode 0600.

Changes apply to new authentications at once; connections already authenticated keep their
session, as in Kafka."""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path
from typing import Protocol

from exactly.security.scram import ScramCredential, ScramMechanism
from exactly.storage.durable import write_durably

log = logging.getLogger("exactly.security")

FILE_NAME = "scram-credentials.json"
_VERSION = 1


class CredentialStoreError(Exception):
    """The credential file exists but cannot be read."""


class CredentialWriteError(OSError):
    """A change could not be stored (the file, or ZooKeeper in a cluster)."""


Credentials = dict[ScramMechanism, ScramCredential]


class CredentialBackend(Protocol):
    """What the broker needs of a credential store: this file store, or the cluster's ZooKeeper
    one (exactly.cluster.zk_scram). ``lookup``/``users``/``set_user`` run on the event loop;
    ``write`` may block (the ZooKeeper store's runs in an executor) and returns each touched
    user's credentials afterwards, which the caller hands to ``set_user``."""

    def lookup(self, user: str, mechanism: ScramMechanism) -> ScramCredential | None: ...

    def users(self) -> dict[str, Credentials]: ...

    def set_user(self, user: str, credentials: Credentials | None) -> None: ...

    def write(
        self,
        upserts: list[tuple[str, ScramMechanism, ScramCredential]],
        deletions: list[tuple[str, ScramMechanism]],
    ) -> dict[str, Credentials]: ...


class CredentialStore:
    """user -> mechanism -> credential, loaded at open and persisted on every change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._users: dict[str, dict[ScramMechanism, ScramCredential]] = {}
        if path.exists():
            self._users = _decode(path.read_bytes())

    @classmethod
    def in_dir(cls, data_dir: Path) -> CredentialStore:
        return cls(data_dir / FILE_NAME)

    def lookup(self, user: str, mechanism: ScramMechanism) -> ScramCredential | None:
        return self._users.get(user, {}).get(mechanism)

    def users(self) -> dict[str, dict[ScramMechanism, ScramCredential]]:
        return {u: dict(m) for u, m in self._users.items()}

    def set_user(self, user: str, credentials: Credentials | None) -> None:
        """Nothing to do: ``write`` has already changed the file and this copy."""

    def write(
        self,
        upserts: list[tuple[str, ScramMechanism, ScramCredential]],
        deletions: list[tuple[str, ScramMechanism]],
    ) -> dict[str, Credentials]:
        touched = {u for u, _m, _c in upserts} | {u for u, _m in deletions}
        try:
            self.apply(upserts, deletions)
        except OSError as exc:
            raise CredentialWriteError(f"cannot write {self.path}: {exc}") from exc
        return {u: dict(self._users.get(u, {})) for u in touched}

    def apply(
        self,
        upserts: list[tuple[str, ScramMechanism, ScramCredential]],
        deletions: list[tuple[str, ScramMechanism]],
    ) -> None:
        """Apply one AlterUserScramCredentials request's accepted changes in one write."""
        users = {u: dict(m) for u, m in self._users.items()}
        for user, mechanism in deletions:
            users.get(user, {}).pop(mechanism, None)
            if user in users and not users[user]:
                del users[user]
        for user, mechanism, credential in upserts:
            users.setdefault(user, {})[mechanism] = credential
        _write(self.path, users)
        self._users = users


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _write(path: Path, users: dict[str, dict[ScramMechanism, ScramCredential]]) -> None:
    obj = {
        "version": _VERSION,
        "users": {
            user: {
                m.mechanism_name: {
                    "salt": _b64(c.salt),
                    "stored_key": _b64(c.stored_key),
                    "server_key": _b64(c.server_key),
                    "iterations": c.iterations,
                }
                for m, c in sorted(mechs.items(), key=lambda kv: kv[0].type_id)
            }
            for user, mechs in sorted(users.items())
        },
    }
    write_durably(path, json.dumps(obj, indent=1).encode(), mode=0o600)


def _decode(data: bytes) -> dict[str, dict[ScramMechanism, ScramCredential]]:
    try:
        obj = json.loads(data)
        if obj.get("version") != _VERSION:
            raise CredentialStoreError(f"unknown credential file version {obj.get('version')!r}")
        out: dict[str, dict[ScramMechanism, ScramCredential]] = {}
        for user, mechs in obj["users"].items():
            for name, fields in mechs.items():
                mechanism = ScramMechanism.by_name(name)
                if mechanism is None:
                    raise CredentialStoreError(f"unknown mechanism {name!r}")
                out.setdefault(user, {})[mechanism] = ScramCredential(
                    base64.b64decode(fields["salt"]),
                    base64.b64decode(fields["stored_key"]),
                    base64.b64decode(fields["server_key"]),
                    int(fields["iterations"]),
                )
        return out
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CredentialStoreError(f"unreadable SCRAM credential file: {exc}") from None
