"""Topic changes with their durable writes off the event loop (the shell of ``storage.topic_changes``).

Why: creating a topic made six fsyncs per one-partition topic on the loop; one CreateTopics of
20 topics stalled every connection for 0.75-0.92 s at load 9 (bench/results/mends-s21.md). The
log manager prepares and completes a change on the loop; ``TopicWrites.apply`` runs the persist
step in one worker thread of its own, so jobs run one at a time in the order they were prepared
(``storage.topics_file``: the one writer of topics.json), and awaits it.

Invariants
----------
* Every plan handed to ``apply`` is completed exactly once, on the loop, with the persist step's
  real outcome, even when the awaiting task is cancelled (a client gone, shutdown): the
  completion is a callback of the job's future, which the caller's cancellation does not cancel
  (``asyncio.shield``); a job that never ran (the executor shut down) completes as failed.
* The caller answers (CreateTopics, DeleteTopics, auto-creation) only after ``apply`` returned:
  the answer follows durable files, as when everything ran on the loop.
* After the log manager's ``close`` a completion does nothing (``close`` settled the logs of
  changes in flight) and queued jobs fail without writing (``TopicsWriterStopped``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging

from exactly.storage.log_manager import LogManager, TopicChangePlan

log = logging.getLogger(__name__)


class TopicWrites:
    """The persist steps of one broker's topic changes, in a worker thread of their own."""

    def __init__(self, logs: LogManager) -> None:
        self.logs = logs
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="topic-writes"
        )

    async def apply(self, plan: TopicChangePlan) -> None:
        """Persist ``plan`` in the worker thread, then complete it on the loop; raises the persist
        step's error (OSError) once the plan is undone."""
        loop = asyncio.get_running_loop()
        persisted = loop.run_in_executor(self._executor, self.logs.persist_topic_change, plan)

        def complete(done: asyncio.Future[None]) -> None:
            error: BaseException | None
            if done.cancelled():
                error = asyncio.CancelledError("the persist step never ran")
            else:
                error = done.exception()
            try:
                self.logs.complete_topic_change(plan, error)
            except Exception:  # a callback must not raise; the change stays reserved, logged
                log.exception("completing the topic change of %s failed", sorted(plan.names))

        # registered first: it runs before the awaiting task resumes
        persisted.add_done_callback(complete)
        await asyncio.shield(persisted)

    def close(self) -> None:
        """After the log manager's ``close``: queued jobs are dropped (completed as failed)."""
        self._executor.shutdown(wait=False, cancel_futures=True)


__all__ = ["TopicWrites"]
