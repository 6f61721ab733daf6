"""Topic naming: Kafka's ``Topic.validate`` and the names of the internal topics.

A leaf module (it imports nothing of ours) because every layer needs these rules: storage refuses
to create a directory for an illegal name, the CreateTopics/Metadata handlers answer
INVALID_TOPIC_EXCEPTION with Kafka's message, Produce and DeleteTopics refuse the internal topics,
and the coordinators persist to them.

A legal name is 1..249 characters of ASCII alphanumerics, ``.``, ``_`` and ``-``, and neither
``.`` nor ``..`` (249 because a partition directory ``<topic>-<partition>`` must stay within a
255-byte file name). Kafka also warns about names that collide once ``.`` and ``_`` are treated
alike; we neither warn nor refuse (nor does Kafka).
"""

from __future__ import annotations

import re

CONSUMER_OFFSETS_TOPIC = "__consumer_offsets"  # Kafka's Topic.GROUP_METADATA_TOPIC_NAME
TRANSACTION_STATE_TOPIC = "__transaction_state"  # Kafka's Topic.TRANSACTION_STATE_TOPIC_NAME
INTERNAL_TOPICS = frozenset({CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})

MAX_TOPIC_LENGTH = 249
LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")


def topic_name_error(name: str) -> str | None:
    """Kafka's Topic.validate: why ``name`` is not a legal topic name (Kafka's message), or None."""
    if not name:
        return "Topic name is illegal, it can't be empty"
    if name in (".", ".."):
        return 'Topic name cannot be "." or ".."'
    if len(name) > MAX_TOPIC_LENGTH:
        return f"Topic name is illegal, it can't be longer than {MAX_TOPIC_LENGTH} characters"
    if not LEGAL_TOPIC.match(name):
        return (
            f"Topic name {name!r} is illegal, it contains a character other than ASCII "
            "alphanumerics, '.', '_' and '-'"
        )
    return None
