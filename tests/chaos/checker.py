"""A pure checker for chaos histories (tests/chaos/history.py), after Jepsen's Kafka workload.

``check(events)`` returns a ``Report`` whose ``anomalies`` map each kind to examples:

* ``lost``              an acknowledged write that must be visible (an acked idempotent send, or a
                        value of a transaction whose commit succeeded; or one value of a transaction
                        other values of which were read under read_committed) was never read, although
                        a consumer read past its offset in that partition.
* ``unseen``            the same, but no consumer got past its offset (the reads stopped short).
* ``duplicate``         one value at two or more offsets.
* ``aborted_read``      a read_committed consumer returned a value of an aborted transaction, or a
                        value no writer ever sent.
* ``inconsistent_offset`` two different values at one (partition, offset), among reads and acks.
* ``order``             one producer's values in one partition are not in the order it sent them
                        (offsets vs. sequence numbers), or one consumer session returned offsets of a
                        partition out of order.
* ``hung``              transactions still open after all faults healed (the LSO never caught up).
* ``stalled``           a writer got no write through (no acknowledged idempotent send, no
                        committed transaction) within 30 s of all faults being healed (a
                        ``stalled`` event written by the runner): a liveness failure.
* ``replica_divergence`` (cluster mode) the replicas of a partition still differ after healing
                        (a ``replicas`` event with ``identical`` false, written by the runner from
                        ``exactly.client.replica_verification``).

The checker never looks at time; it is deterministic for a given event list.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from tests.chaos.history import Event, parse_value

KINDS = (
    "lost",
    "unseen",
    "duplicate",
    "aborted_read",
    "inconsistent_offset",
    "order",
    "hung",
    "stalled",
    "replica_divergence",
)
MAX_EXAMPLES = 10


@dataclass
class Write:
    value: str
    writer: str
    seq: int
    partition: int | None = None
    txn: str | None = None  # None: idempotent (non-transactional) send
    acks: set[tuple[int, int]] = field(default_factory=set)  # (partition, offset) from delivery reports
    # Delivered without an offset: librdkafka acks a request it had given up on (timed out) once a
    # later sequence of the same partition is acknowledged -- the broker must then hold it.
    acked_unknown_offset: bool = False


@dataclass
class Report:
    anomalies: dict[str, list[Any]] = field(default_factory=lambda: {k: [] for k in KINDS})
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    stats: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, example: Any) -> None:
        self.counts[kind] += 1
        if len(self.anomalies[kind]) < MAX_EXAMPLES:
            self.anomalies[kind].append(example)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def ok(self) -> bool:
        return self.total == 0

    def summary(self) -> str:
        stats = " ".join(f"{k}={v}" for k, v in sorted(self.stats.items()))
        if self.ok:
            return f"OK: 0 anomalies ({stats})"
        lines = [f"FAIL: {self.total} anomalies ({stats})"]
        for kind in KINDS:
            if self.counts[kind]:
                lines.append(f"  {kind}: {self.counts[kind]}")
                lines.extend(f"    e.g. {ex}" for ex in self.anomalies[kind])
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "counts": self.counts, "anomalies": self.anomalies, "stats": self.stats}


def check(events: list[Event]) -> Report:
    report = Report()
    writes: dict[str, Write] = {}
    txn_result: dict[str, str] = {}
    txn_values: dict[str, list[str]] = defaultdict(list)

    def write_of(value: str) -> Write:
        w = writes.get(value)
        if w is None:
            parsed = parse_value(value)
            writer, seq = parsed if parsed is not None else (value, -1)
            w = writes[value] = Write(value, writer, seq)
        return w

    # ---- writes -------------------------------------------------------------------------------
    for e in events:
        t = e["t"]
        if t == "send":
            w = write_of(e["v"])
            w.partition = e.get("p")
        elif t == "txn_begin":
            txn_result.setdefault(e["txn"], "unknown")
        elif t == "txn_send":
            w = write_of(e["v"])
            w.partition = e.get("p")
            w.txn = e["txn"]
            txn_values[e["txn"]].append(e["v"])
            txn_result.setdefault(e["txn"], "unknown")
        elif t == "ack":
            w = write_of(e["v"])
            if e.get("o") is None:
                w.acked_unknown_offset = True
            else:
                w.acks.add((int(e["p"]), int(e["o"])))
        elif t == "txn_end":
            result = e.get("result", "unknown")
            if result == "ok":
                txn_result[e["txn"]] = "committed" if e.get("intent") == "commit" else "aborted"
            elif result == "aborted":
                txn_result[e["txn"]] = "aborted"
            else:
                txn_result[e["txn"]] = "unknown"

    # ---- reads --------------------------------------------------------------------------------
    at_offset: dict[tuple[int, int], set[str]] = defaultdict(set)  # (p, o) -> values
    positions: dict[str, set[tuple[int, int]]] = defaultdict(set)  # value -> {(p, o)}
    read_rc: set[str] = set()
    read_any: set[str] = set()
    reached: dict[int, int] = defaultdict(int)  # partition -> highest offset any consumer got past
    n_reads = 0
    for e in events:
        if e["t"] != "read":
            continue
        iso = e.get("iso", "ru")
        last: dict[int, int] = {}
        for p, o, v in e.get("recs", ()):
            p, o = int(p), int(o)
            n_reads += 1
            at_offset[(p, o)].add(v)
            positions[v].add((p, o))
            read_any.add(v)
            reached[p] = max(reached[p], o + 1)
            if iso == "rc":
                read_rc.add(v)
                rw = writes.get(v)
                if rw is None or rw.seq < 0:
                    report.add("aborted_read", {"why": "value never written", "value": v, "at": [p, o]})
                elif rw.txn is not None and txn_result.get(rw.txn) == "aborted":
                    report.add(
                        "aborted_read",
                        {"value": v, "at": [p, o], "txn": rw.txn, "by": e.get("proc")},
                    )
            if p in last and o <= last[p]:
                report.add(
                    "order",
                    {
                        "why": "consumer went backwards",
                        "proc": e.get("proc"),
                        "session": e.get("session"),
                        "partition": p,
                        "offsets": [last[p], o],
                    },
                )
            last[p] = o
        for p, pos in (e.get("upto") or {}).items():
            reached[int(p)] = max(reached[int(p)], int(pos))

    # sessions span several read events: check their order across events too
    _check_session_order(events, report)

    # ---- acks vs reads: inconsistent offsets, duplicates --------------------------------------
    for w in writes.values():
        for p, o in w.acks:
            at_offset[(p, o)].add(w.value)
            positions[w.value].add((p, o))
    for (p, o), vals in sorted(at_offset.items()):
        if len(vals) > 1:
            report.add("inconsistent_offset", {"partition": p, "offset": o, "values": sorted(vals)})
    for v, pos in sorted(positions.items()):
        if len(pos) > 1:
            report.add("duplicate", {"value": v, "at": sorted(pos)})

    # ---- lost / unseen ------------------------------------------------------------------------
    effectively_committed = {
        txn
        for txn, vals in txn_values.items()
        if txn_result.get(txn) == "committed"
        or (txn_result.get(txn) == "unknown" and any(v in read_rc for v in vals))
    }
    for w in writes.values():
        if w.txn is None:
            must = bool(w.acks) or w.acked_unknown_offset
        else:
            must = w.txn in effectively_committed
        if not must or w.value in read_any:
            continue
        where = sorted(w.acks) or ([(w.partition, -1)] if w.partition is not None else [])
        past = any(p is not None and 0 <= o < reached.get(p, 0) for p, o in where)
        example = {
            "value": w.value,
            "acked_at": sorted(w.acks),
            "txn": w.txn,
            "txn_result": txn_result.get(w.txn) if w.txn else None,
        }
        report.add("lost" if past else "unseen", example)

    # ---- order within a partition for one producer --------------------------------------------
    by_writer: dict[tuple[str, int], list[tuple[int, int, str]]] = defaultdict(list)
    for v, pos in positions.items():
        ow = writes.get(v)
        if ow is None or ow.seq < 0 or len(pos) != 1:
            continue  # duplicates are reported as such
        ((p, o),) = pos
        by_writer[(ow.writer, p)].append((o, ow.seq, v))
    for (writer, p), items in sorted(by_writer.items()):
        items.sort()
        for (o1, s1, v1), (o2, s2, v2) in itertools.pairwise(items):
            if s2 < s1:
                report.add(
                    "order",
                    {
                        "why": "producer order",
                        "writer": writer,
                        "partition": p,
                        "offsets": [[o1, v1], [o2, v2]],
                    },
                )

    for e in events:
        if e["t"] == "hung":
            report.add("hung", {"hw": e.get("hw"), "lso": e.get("lso")})
        elif e["t"] == "stalled":
            report.add("stalled", {"writers": e.get("writers"), "seconds": e.get("seconds")})
        elif e["t"] == "replicas" and not e.get("identical", True):
            report.add("replica_divergence", e.get("verdicts"))

    results = list(txn_result.values())
    report.stats = {
        "writes": len(writes),
        "acked": sum(1 for w in writes.values() if w.acks or w.acked_unknown_offset),
        "txns": len(txn_result),
        "committed": results.count("committed"),
        "aborted": results.count("aborted"),
        "txn_unknown": results.count("unknown"),
        "reads": n_reads,
        "distinct_read": len(read_any),
        "faults": sum(1 for e in events if e["t"] == "fault"),
    }
    return report


def _check_session_order(events: list[Event], report: Report) -> None:
    """Offsets one consumer session returns for one partition must increase across its polls."""
    last: dict[tuple[str, Any, int], int] = {}
    for e in events:
        if e["t"] != "read":
            continue
        key_base = (str(e.get("proc")), e.get("session"))
        first_in_event: dict[int, int] = {}
        for p, o, _v in e.get("recs", ()):
            first_in_event.setdefault(int(p), int(o))
        for p, o in first_in_event.items():
            key = (*key_base, p)
            if key in last and o <= last[key]:
                report.add(
                    "order",
                    {
                        "why": "consumer went backwards",
                        "proc": key_base[0],
                        "session": key_base[1],
                        "partition": p,
                        "offsets": [last[key], o],
                    },
                )
        for p, o, _v in e.get("recs", ()):
            last[(*key_base, int(p))] = int(o)
