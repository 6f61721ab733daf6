#!/usr/bin/env python3
"""Copy ``src`` to DEST and instrument the copy for an acks=all timeline (never the checkout itself).

    python bench/cluster_timeline/instrument.py /tmp/traced     # then /tmp/traced/src

Each rule inserts ``if _trace.ON: _trace.t(event, a, b)`` at one point of the produce ->
replicate -> acknowledge chain (the leader's produce handler, follower fetch accounting, HW moves,
delayed-produce completion, Fetch wake-ups and answers, socket writes, the follower's fetcher). The
anchors are source text: a rule whose anchor moved fails loudly (update it, do not guess).
``_trace`` records ``time.monotonic_ns()`` (comparable across processes on one machine) into a
list, plus the collector's start/stop, dumped at exit to ``$EXACTLY_TRACE/trace-<pid>.txt``.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
IMP = "from exactly import _trace\n"
TRACE_MODULE = '"""Temporary trace written into an instrumented copy of src by bench/cluster_timeline/instrument.py."""\n\nimport atexit\nimport gc\nimport os\nimport time\n\nON = bool(os.environ.get("EXACTLY_TRACE"))\n_ev: list = []\n_ns = time.monotonic_ns\n\n\ndef t(name, a=0, b=0):\n    _ev.append((_ns(), name, a, b))\n\n\ndef _dump():\n    path = os.path.join(os.environ["EXACTLY_TRACE"], f"trace-{os.getpid()}.txt")\n    with open(path, "w") as f:\n        for ns, n, a, b in _ev:\n            f.write(f"{ns} {n} {a} {b}\\n")\n\n\ndef _gc(phase, info):\n    _ev.append((_ns(), "gc_" + phase, info["generation"], info.get("collected", 0)))\n\n\nif ON:\n    atexit.register(_dump)\n    gc.callbacks.append(_gc)\n'


def T(ind: str, call: str) -> str:
    return f"{ind}if _trace.ON:\n{ind}    _trace.t({call})\n"


def patch(p: str, anchor_import: str, reps: list[tuple[str, str]]) -> None:
    s = Path(p).read_text()
    if IMP not in s:
        s = s.replace(anchor_import, anchor_import + IMP, 1)
    for old, new in reps:
        if old not in s:
            raise SystemExit(f"{p}: anchor not found: {old[:70]!r}")
        s = s.replace(old, new, 1)
    Path(p).write_text(s)


def main() -> None:
    dest = Path(sys.argv[1]).resolve()
    shutil.rmtree(dest / "src", ignore_errors=True)
    shutil.copytree(SRC, dest / "src")
    (dest / "src" / "exactly" / "_trace.py").write_text(TRACE_MODULE)
    os.chdir(dest)
    patch(
        "src/exactly/server/handlers/produce.py",
        "from exactly.types import TopicPartition\n",
        [
            (
                "    acks = request.acks\n    now = now_ms()\n",
                "    acks = request.acks\n    now = now_ms()\n" + T("    ", '"p_start"'),
            ),
            (
                "        left -= 1\n        if left == 0:\n",
                "        left -= 1\n        if left == 0:\n" + T("            ", '"p_resume"'),
            ),
            (
                "        broker.metrics.messages_in += header.record_count\n",
                "        broker.metrics.messages_in += header.record_count\n"
                + T("        ", '"p_app", plog.log_end_offset'),
            ),
        ],
    )
    patch(
        "src/exactly/server/leader_replicas.py",
        "from exactly.types import TopicPartition\n",
        [
            (
                "        plog = self.broker.logs.get_partition(tp)\n        if plog is not None:\n            plog.update_high_watermark(leader.high_watermark)\n        self.delayed_produces.wake(tp)",
                "        plog = self.broker.logs.get_partition(tp)\n"
                + T("        ", '"hw", leader.high_watermark')
                + "        if plog is not None:\n            plog.update_high_watermark(leader.high_watermark)\n        self.delayed_produces.wake(tp)",
            ),
            (
                "        leader = self.leaders.get(plog.tp)\n        if leader is None or replica_id == self.broker_id:",
                "        leader = self.leaders.get(plog.tp)\n"
                + T("        ", '"l_ffetch", replica_id, fetch_offset')
                + "        if leader is None or replica_id == self.broker_id:",
            ),
        ],
    )
    patch(
        "src/exactly/server/delayed_produce.py",
        "from exactly.types import TopicPartition\n",
        [
            (
                "            _complete(entry, code)\n",
                T("            ", '"ack_done", entry.required_offset')
                + "            _complete(entry, code)\n",
            ),
        ],
    )
    patch(
        "src/exactly/server/handlers/fetch.py",
        "from exactly.types import TopicPartition\n",
        [
            (
                "        await broker.waiters.wait(tps, remaining, up_to_log_end=from_follower)\n",
                "        await broker.waiters.wait(tps, remaining, up_to_log_end=from_follower)\n"
                + T("        ", '"f_woken", int(getattr(request, "replica_id", -1))'),
            ),
            (
                "    return encode_fetch_response(ctx.version, 0, 0, responses)\n",
                T("    ", '"f_resp", int(getattr(request, "replica_id", -1)), total')
                + "    return encode_fetch_response(ctx.version, 0, 0, responses)\n",
            ),
            (  # a parked follower fetch: its answer is sent by what fire() returns
                "        return partial(answer.set_result, response)\n",
                "        _rid, _total = int(getattr(request, 'replica_id', -1)), locals().get('total', 0)\n\n"
                "        def _send():\n"
                + T("            ", '"f_resp", _rid, _total')
                + "            answer.set_result(response)\n\n"
                "        return _send\n",
            ),
        ],
    )
    patch(
        "src/exactly/server/plain_write.py",
        "from exactly.storage.file_slice import FileSlice\n",
        [
            ('    """``writelines``', T("    ", '"write", len(chunks)') + '    """``writelines``'),
        ],
    )
    patch(
        "src/exactly/server/connection.py",
        "from exactly.server.tls_write import write_tls\n",
        [
            (
                "        if len(frames) >= MAX_QUEUED_FRAMES and not self._paused_reading",
                T("        ", '"frame_in", int.from_bytes(frames[-1][:2], "big")')
                + "        if len(frames) >= MAX_QUEUED_FRAMES and not self._paused_reading",
            ),
        ],
    )
    patch(
        "src/exactly/server/replica_channel.py",
        "from exactly.protocol.framing import FrameError, Framer\n",
        [
            (
                "        frames = self.framer.frames\n        if frames and self._on_frame is not None",
                "        frames = self.framer.frames\n"
                + "        if frames:\n"
                + T("            ", '"r_frame", nbytes')
                + "        if frames and self._on_frame is not None",
            ),
            (
                "        self.transport.write(request)\n        self._sent_at = loop.time()",
                T("        ", '"r_send"')
                + "        self.transport.write(request)\n        self._sent_at = loop.time()",
            ),
            (  # the next Fetch written by the frame handler, in the receive callback
                "            transport.write(outcome)\n",
                T("            ", '"r_send"') + "            transport.write(outcome)\n",
            ),
            (
                "                if frames:\n                    return frames.popleft()\n",
                "                if frames:\n"
                + T("                    ", '"r_resume"')
                + "                    return frames.popleft()\n",
            ),
        ],
    )
    patch(
        "src/exactly/server/replica_fetcher.py",
        "from exactly.types import TopicPartition\n",
        [
            (
                "        plog.update_high_watermark(min(hw, plog.log_end_offset))\n",
                T("        ", '"r_appended", plog.log_end_offset')
                + "        plog.update_high_watermark(min(hw, plog.log_end_offset))\n",
            ),
        ],
    )
    patch(  # the cluster produce fast path (the common Produce at a leader)
        "src/exactly/server/produce_fast_cluster.py",
        "from exactly.types import TopicPartition\n",
        [
            (
                "        replicas.leading.leader_appended(plog, leader)\n",
                T("        ", '"p_app", plog.log_end_offset')
                + "        replicas.leading.leader_appended(plog, leader)\n",
            ),
            (
                "        common = read_common_produce(payload)\n",
                T("        ", '"p_start"') + "        common = read_common_produce(payload)\n",
            ),
        ],
    )
    patch(  # the follower Fetch fast path: its parked answer prepared on a wake-up
        "src/exactly/server/follower_fetch_fast.py",
        "from exactly.types import TopicPartition\n",
        [
            (
                "                framed = _frame(broker, version, self.correlation_id, answers)\n",
                "                framed = _frame(broker, version, self.correlation_id, answers)\n"
                + T("                ", '"f_resp", self.replica_id, total'),
            ),
            (  # answered on arrival (data was there already: the Fetch was not parked)
                "            if total >= min_bytes or deadline - time.monotonic() <= 0:\n                return _frame(",
                '            if _trace.ON:\n                _trace.t("f_arr_resp", replica_id, total)\n'
                "            if total >= min_bytes or deadline - time.monotonic() <= 0:\n                return _frame(",
            ),
            (  # parked
                "        parked.checked_at = checked_at\n",
                "        parked.checked_at = checked_at\n" + T("        ", '"f_park", replica_id'),
            ),
        ],
    )
    print(f"instrumented copy: {dest / 'src'}")


if __name__ == "__main__":
    main()
