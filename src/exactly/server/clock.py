"""Wall-clock milliseconds, the unit of every Kafka timestamp and timeout.

A leaf module (imports nothing of ours), so the broker, the coordinator runtimes and the handlers
can all share one clock without import cycles.
"""

from __future__ import annotations

import time


def now_ms() -> int:
    return time.time_ns() // 1_000_000
