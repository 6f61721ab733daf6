"""Event-loop lag monitor for a broker process (``bench/cleaner_loop_stall.py``).

Imported by Python at start-up when this directory is on PYTHONPATH. Does nothing unless
``EXACTLY_LOOPLAG`` names an output stem and the process is the broker (``asyncio.run``)
(``EXACTLY_LOOPLAG_MS``: the late-turn threshold, default 30 ms). Then:

- a callback every ``TICK_S`` on the broker's event loop logs every turn that came more than
  ``LAG_MS`` late, with ``time.perf_counter()`` (CLOCK_MONOTONIC: the bench client's clock too);
- the same callback re-arms ``faulthandler.dump_traceback_later``: if the loop does not come back
  within ``DUMP_S``, faulthandler's own C thread (no GIL needed) dumps every thread's stack into
  the file: what the loop was doing while it stalled;
- each late turn also says how much of it the loop's thread spent waiting for a CPU
  (``/proc/thread-self/schedstat``) and on one (``time.thread_time``): the rest it slept or was
  blocked in a system call;
- ``gc.callbacks`` log every collection taking more than ``GC_MS``.
"""

import os

if os.environ.get("EXACTLY_LOOPLAG"):
    import asyncio
    import faulthandler
    import gc
    import time

    TICK_S = 0.01
    LAG_MS = float(os.environ.get("EXACTLY_LOOPLAG_MS", "30"))  # late-turn threshold
    DUMP_S = 0.08
    GC_MS = 10.0
    _stem = os.environ["EXACTLY_LOOPLAG"]
    _orig_run = asyncio.run
    _state = {"gc_t0": 0.0}

    def _open():
        f = open(f"{_stem}-{os.getpid()}.log", "a", buffering=1)  # noqa: SIM115
        return f

    def _install(loop):
        f = _open()
        f.write(f"start {time.perf_counter():.6f} pid {os.getpid()}\n")

        def on_gc(phase, info):
            if phase == "start":
                _state["gc_t0"] = time.perf_counter()
            else:
                took = (time.perf_counter() - _state["gc_t0"]) * 1000
                if took >= GC_MS:
                    f.write(f"gc {time.perf_counter():.6f} gen {info['generation']} took_ms {took:.1f}\n")

        gc.callbacks.append(on_gc)
        last = [time.perf_counter(), 0.0, time.thread_time()]
        sched = open("/proc/thread-self/schedstat", "rb", buffering=0)  # noqa: SIM115

        def run_delay_s():
            sched.seek(0)
            return int(sched.read().split()[1]) / 1e9

        last[1] = run_delay_s()

        def tick():
            now, delay, cpu = time.perf_counter(), run_delay_s(), time.thread_time()
            lag = (now - last[0] - TICK_S) * 1000
            if lag >= LAG_MS:
                # of the turn's time since the last tick: waiting for a CPU, on a CPU; the rest
                # the loop slept or was blocked in a system call
                f.write(
                    f"lag {now:.6f} ms {lag:.1f} runq_ms {(delay - last[1]) * 1000:.1f} "
                    f"cpu_ms {(cpu - last[2]) * 1000:.1f}\n"
                )
            last[0], last[1], last[2] = now, delay, cpu
            faulthandler.dump_traceback_later(DUMP_S, repeat=False, file=f)
            loop.call_later(TICK_S, tick)

        loop.call_soon(tick)

    def _run(main, **kw):
        async def wrapped():
            _install(asyncio.get_running_loop())
            return await main

        return _orig_run(wrapped(), **kw)

    asyncio.run = _run
