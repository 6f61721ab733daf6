"""Log compaction (issue #11): the internal topics after *a month* of operation, compressed in time.

``compaction-internal`` writes its million offset commits and hundred thousand transactions as fast
as the broker takes them: a few minutes, all of them younger than ``delete.retention.ms`` (24 h). A
COMMIT marker may only go ``delete.retention.ms`` after the cleaner first found no data of its
transaction left (Kafka's rule: a reader or a follower far behind must still see the transaction
decided), so right after that load every one of the 100,000 markers is still there, and it is most
of what a cleaned ``__consumer_offsets`` holds. That is the honest figure for *a day* of that much
traffic, not for a month of it.

``compaction-internal-month`` gives the same load the timeline of a month: the offset commits and
the transactions are interleaved (one 100-partition OffsetCommit per ten transactions, as a steady
pipeline does) and paced evenly over ``month_s`` seconds of wall time, which stand for 30 days, and
every time-based setting whose period is shorter than that month is scaled by the same factor
(``month_s`` / 30 days):

- ``log.cleaner.delete.retention.ms`` (24 h): a simulated day, ``month_s`` / 30 seconds;
- the others are left at their defaults, because the load never reaches them, scaled or not:
  each transactional id and each group commits every 0.6 simulated days (``tids`` = 2,000 over
  100,000 transactions), under ``producer.id.expiration.ms`` (1 d), ``transactional.id.expiration.ms``
  (7 d) and ``offsets.retention.minutes`` (7 d); ``min.compaction.lag.ms`` is 0 and the segments
  roll by size (``segment.ms``, 7 d, never comes into play).

The pacing only ever waits (an operation is sent no earlier than its place on the timeline); on a
loaded box the load can fall behind, and then the month took longer than ``month_s`` and a
simulated day is *shorter* than ``delete.retention.ms`` covers: the sample records the wall time and
the simulated hours the retention covered (``retention_sim_h``: 24 or more is honest), and a run
that fell more than 10 % behind is not ok.
"""

from __future__ import annotations

import time
from typing import Any

from benchlib.compaction_workloads import InternalTopicsCompaction, Wire, offset_commits, transactions
from benchlib.workloads import Context, register

MONTH_DAYS = 30
DAY_MS = 86_400_000
#: Transactions per 100-partition OffsetCommit request (100,000 transactions, 10,000 requests).
TXNS_PER_COMMIT = 10


@register
class InternalTopicsMonth(InternalTopicsCompaction):
    name = "compaction-internal-month"
    title = "internal topics as compaction-internal, the load paced over a month compressed in time"
    month_s_value = 1800.0

    def month_s(self, ctx: Context) -> float:
        return 120.0 if ctx.quick else 1800.0

    def time_options(self, ctx: Context) -> list[str]:
        day_ms = int(self.month_s(ctx) * 1000 / MONTH_DAYS)
        return [f"log.cleaner.delete.retention.ms={day_ms}"]

    def write_load(self, w: Wire, shape: dict[str, int], sample: dict[str, Any], v: str) -> None:
        month_s = self.month_s_value
        commit_requests = shape["commits"] // 100
        txns = shape["transactions"]
        steps = max(txns // TXNS_PER_COMMIT, commit_requests)
        producers: dict[int, tuple[int, int]] = {}
        commits_done = txns_done = 0
        t0 = time.perf_counter()
        for step in range(steps):
            due = t0 + month_s * step / steps
            now = time.perf_counter()
            if due > now:
                time.sleep(due - now)
            if commits_done < commit_requests and step * commit_requests // steps >= commits_done:
                offset_commits(w, 100, shape["groups"], "bench-offsets", start=commits_done)
                commits_done += 1
            batch = min(TXNS_PER_COMMIT, txns - txns_done)
            if batch > 0:
                transactions(w, batch, shape["tids"], "bench-offsets", start=txns_done, producers=producers)
                txns_done += batch
        if commits_done < commit_requests:
            offset_commits(
                w,
                (commit_requests - commits_done) * 100,
                shape["groups"],
                "bench-offsets",
                start=commits_done,
            )
        if txns_done < txns:
            transactions(
                w, txns - txns_done, shape["tids"], "bench-offsets", start=txns_done, producers=producers
            )
        took = time.perf_counter() - t0
        sample[f"{v}_load_s"] = took
        sample[f"{v}_commit_s"] = sample[f"{v}_txn_s"] = took  # interleaved: one figure for both
        sample["month_s"] = month_s
        # the retention in simulated hours: 24 when the load kept to its timeline, less when it fell behind
        sample[f"{v}_retention_sim_h"] = 24.0 * month_s / max(took, month_s)
        if took > 1.1 * month_s:
            sample["ok"] = False
            sample["error"] = f"the {v} load took {took:.0f} s, more than 10 % over its {month_s:.0f} s month"

    def run_once(self, ctx: Context, broker: Any, state: Any, rep: int) -> dict[str, Any]:
        self.month_s_value = self.month_s(ctx)
        sample = super().run_once(ctx, broker, state, rep)
        sample["retention_sim_h"] = min(
            sample.get("on_retention_sim_h", 0.0), sample.get("off_retention_sim_h", 0.0)
        )
        return sample
