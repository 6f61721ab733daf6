"""SCRAM credentials of a cluster in ZooKeeper, in Kafka's layout, so every broker authenticates
the same users and Kafka's own tools read what exactly writes.

``/config/users/<user>`` holds ``{"version":1,"config":{"SCRAM-SHA-512":"salt=..,stored_key=..,
server_key=..,iterations=N", ...}}`` (Kafka's ScramCredentialUtils format; base64 values), and
every change leaves ``/config/changes/config_change_<seq>`` = ``{"version":2,"entity_path":
"users/<user>"}`` as Kafka's admin path does. A node without SCRAM entries is deleted.

Each broker keeps a copy for the event loop (authentication must not wait for ZooKeeper):
a children watch on ``/config/users`` and a data watch per user (kazoo threads) parse the node
and hand the result to the loop through ``hop``; ``lookup``/``users`` read that copy. ``write``
(blocking: run it in an executor) changes the nodes and returns the new entries, which the
caller also applies locally at once, so the broker that answered the request sees its change
before the watch fires."""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError

from exactly.cluster import znodes as zn
from exactly.cluster.zk_base import ensure_path
from exactly.security.credentials import CredentialWriteError
from exactly.security.scram import ScramCredential, ScramMechanism

log = logging.getLogger("exactly.cluster.scram")

CONFIG_USERS = "/config/users"
Credentials = dict[ScramMechanism, ScramCredential]


class ScramZnodeError(ValueError):
    """A /config/users node that is not Kafka's format."""


def user_path(user: str) -> str:
    return f"{CONFIG_USERS}/{user}"


def encode_scram(credential: ScramCredential) -> str:
    b64 = base64.b64encode
    return (
        f"salt={b64(credential.salt).decode()},stored_key={b64(credential.stored_key).decode()},"
        f"server_key={b64(credential.server_key).decode()},iterations={credential.iterations}"
    )


def decode_scram(text: str) -> ScramCredential:
    fields = dict(part.split("=", 1) for part in text.split(",") if "=" in part)
    try:
        return ScramCredential(
            base64.b64decode(fields["salt"], validate=True),
            base64.b64decode(fields["stored_key"], validate=True),
            base64.b64decode(fields["server_key"], validate=True),
            int(fields["iterations"]),
        )
    except (KeyError, ValueError, binascii.Error) as exc:
        raise ScramZnodeError(f"bad SCRAM credential {text[:40]!r}...: {exc}") from None


def encode_user_config(config: Mapping[str, str]) -> bytes:
    return json.dumps({"version": 1, "config": dict(config)}, separators=(",", ":")).encode()


def decode_user_config(data: bytes | None) -> dict[str, str]:
    """The ``config`` map of a user node (other entity configs, e.g. quotas, are kept as text)."""
    if not data:
        return {}
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ScramZnodeError(f"user node is not JSON: {exc}") from None
    config = obj.get("config") if isinstance(obj, dict) else None
    if not isinstance(config, dict):
        raise ScramZnodeError("user node has no config object")
    return {str(k): str(v) for k, v in config.items()}


def credentials_of(config: Mapping[str, str]) -> Credentials:
    out: Credentials = {}
    for name, value in config.items():
        mechanism = ScramMechanism.by_name(name)
        if mechanism is not None:
            out[mechanism] = decode_scram(value)
    return out


class ZkScramStore:
    """The cluster's credentials: ``lookup``/``users`` from the loop's copy; ``write`` to ZooKeeper."""

    def __init__(self) -> None:
        self._users: dict[str, Credentials] = {}
        self._client: Any = None
        self._watched: set[str] = set()

    # --- event loop ---------------------------------------------------------------------------
    def lookup(self, user: str, mechanism: ScramMechanism) -> ScramCredential | None:
        return self._users.get(user, {}).get(mechanism)

    def users(self) -> dict[str, Credentials]:
        return {u: dict(m) for u, m in self._users.items()}

    def set_user(self, user: str, credentials: Credentials | None) -> None:
        if credentials:
            self._users[user] = dict(credentials)
        else:
            self._users.pop(user, None)

    # --- kazoo threads ------------------------------------------------------------------------
    def start(self, client: Any, hop: Callable[..., None]) -> None:
        """Watch ``/config/users``; ``hop(fn, *args)`` runs ``fn`` on the event loop."""
        self._client = client
        ensure_path(client, CONFIG_USERS)

        def on_users(children: list[str]) -> None:
            for user in children:
                if user not in self._watched:
                    self._watched.add(user)
                    self._watch_user(client, user, hop)

        client.ChildrenWatch(CONFIG_USERS, on_users)

    def _watch_user(self, client: Any, user: str, hop: Callable[..., None]) -> None:
        def on_data(data: bytes | None, _stat: Any) -> bool | None:
            if data is None:  # deleted: stop watching (a re-created node gets a new watch)
                self._watched.discard(user)
                hop(self.set_user, user, None)
                return False
            try:
                hop(self.set_user, user, credentials_of(decode_user_config(data)))
            except ScramZnodeError as exc:
                log.warning("SCRAM credentials of user %s unreadable: %s", user, exc)
            return None

        client.DataWatch(user_path(user), on_data)

    def write(
        self,
        upserts: list[tuple[str, ScramMechanism, ScramCredential]],
        deletions: list[tuple[str, ScramMechanism]],
    ) -> dict[str, Credentials]:
        """Apply the accepted changes of one AlterUserScramCredentials request (blocking).
        Returns each touched user's credentials afterwards; CredentialWriteError when ZooKeeper
        refuses or is unreachable."""
        try:
            return self._write(upserts, deletions)
        except (KazooException, ScramZnodeError) as exc:
            raise CredentialWriteError(f"cannot write SCRAM credentials to ZooKeeper: {exc!r}") from exc

    def _write(
        self,
        upserts: list[tuple[str, ScramMechanism, ScramCredential]],
        deletions: list[tuple[str, ScramMechanism]],
    ) -> dict[str, Credentials]:
        client = self._client
        if client is None:
            raise KazooException("the SCRAM credential store is not connected")
        touched: dict[str, list[tuple[ScramMechanism, ScramCredential | None]]] = {}
        for user, mechanism in deletions:
            touched.setdefault(user, []).append((mechanism, None))
        for user, mechanism, credential in upserts:
            touched.setdefault(user, []).append((mechanism, credential))
        result: dict[str, Credentials] = {}
        for user, changes in touched.items():
            path = user_path(user)
            try:
                data, stat = client.get(path)
                config, version = decode_user_config(data), stat.version
            except NoNodeError:
                config, version = {}, None
            for mechanism, new in changes:
                if new is None:
                    config.pop(mechanism.mechanism_name, None)
                else:
                    config[mechanism.mechanism_name] = encode_scram(new)
            if version is None:
                try:
                    client.create(path, encode_user_config(config), makepath=True)
                except NodeExistsError:  # raced with another broker: last writer wins, as in Kafka
                    client.set(path, encode_user_config(config))
            elif config:
                client.set(path, encode_user_config(config), version=version)
            else:
                client.delete(path, version=version)
            client.create(
                f"{zn.CONFIG_CHANGES}/config_change_",
                json.dumps({"version": 2, "entity_path": f"users/{user}"}, separators=(",", ":")).encode(),
                sequence=True,
                makepath=True,
            )
            result[user] = credentials_of(config)
        return result
