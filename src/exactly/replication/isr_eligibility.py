"""Which brokers a partition leader may take (back) into an ISR: Kafka's
``Partition.isReplicaIsrEligible`` (KIP-841 / KAFKA-14140), fed by two separate ZooKeeper watches.

Kafka's rule: a replica joins the ISR only if its broker is alive (registered) and not shutting
down; a broker in controlled shutdown never re-enters an ISR. Kafka's controller keeps a broker
in its shutting-down set until it handles that broker's failure, in one event thread, so "no
longer shutting down" and "no longer alive" are one step there.

Here a leader learns the two facts from two watches: ``/brokers/ids`` (the live brokers with
their broker epochs) and ``/controlled_shutdown`` (the pending requests, each naming the broker
epoch it was made in). Both znodes of a leaving broker are ephemerals of one session and vanish
in one ZooKeeper transaction, but the leader sees two notifications, each followed by its own
reads, handed to the event loop one after the other in either order (the broker set needs
several reads, the requests one, so the requests tend to come first). Reading "eligible" as
"registered and without a request *now*" leaves a window between the two in which the leaving
broker is registered with no request: a Fetch it sent just before it stopped its fetchers, read
by the leader in that window, took it back into the ISR (seen under load in
``test_sigterm_moves_leadership_before_the_leader_leaves``).

Hence the rule kept here: a request marks its broker epoch as leaving, and that mark outlives the
request. A broker is eligible only while it is registered at an epoch that has never been marked:
the mark ends with that registration, so a restarted broker (a new session, a larger epoch) is
eligible again, and a request from an older registration (Kafka's STALE_BROKER_EPOCH) marks
nothing current. A request and its registration belong to one session, so no request disappears
while its registration legitimately stays; and since the mark names an epoch, the order in which
the two watches deliver never matters (a bounce seen as "new registration" before "old request
gone" does not mark the new registration).

Sans-IO: immutable values, no clock, no ZooKeeper; the replica manager holds the current one and
replaces it on every watch hop.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class IsrEligibility:
    """``live``: registered broker id -> broker epoch (czxid of its registration).
    ``marked``: broker id -> the largest broker epoch a controlled-shutdown request was seen for.

    Invariant: ``marked`` only grows per broker (an epoch is replaced by a larger one only);
    entries whose registration went stay, harmless, since broker epochs are never reused."""

    live: Mapping[int, int] = field(default_factory=dict)
    marked: Mapping[int, int] = field(default_factory=dict)

    def on_brokers(self, live: Mapping[int, int]) -> IsrEligibility:
        """A new read of ``/brokers/ids``."""
        return IsrEligibility(dict(live), self.marked)

    def on_shutdown_requests(self, requests: Iterable[tuple[int, int]]) -> IsrEligibility:
        """A new read of the pending requests, as (broker id, broker epoch) pairs. Requests that
        disappeared unmark nothing."""
        marked = dict(self.marked)
        for broker, epoch in requests:
            if epoch > marked.get(broker, -1):
                marked[broker] = epoch
        return IsrEligibility(self.live, marked)

    @property
    def shutting_down(self) -> frozenset[int]:
        """Registered brokers whose current registration asked for a controlled shutdown."""
        return frozenset(b for b, epoch in self.live.items() if self.marked.get(b) == epoch)

    def eligible(self, broker: int) -> bool:
        """Whether ``broker`` may join an ISR: registered, at an epoch never marked as leaving."""
        epoch = self.live.get(broker)
        return epoch is not None and self.marked.get(broker) != epoch
