"""CPU-time cProfile of a broker process, switched by signals (``bench/request_rate.py --cprofile``).

Imported by Python at start-up when this directory is on PYTHONPATH. Does nothing unless
``EXACTLY_CPROFILE`` names an output stem. Then SIGUSR1 starts profiling the main thread (the
event loop) and SIGUSR2 stops it and writes ``<stem>-<n>.pstats`` and a text summary.

Why CPU time (``time.thread_time``) and not wall time: on a loaded 2-core box a sampling
profiler charges the time a runnable broker waits for a core to whatever line it was preempted
at (mostly the ``send()`` that woke the client), so wall-clock percentages mostly show the
scheduler. thread_time costs a system call per reading, which inflates functions called very
often; read call counts next to the times.

The cyclic garbage collector's runs are not charged to any function, so the summary starts with
them: collections per generation during the profile and their CPU time (``gc.callbacks``).
"""

import os

if os.environ.get("EXACTLY_CPROFILE"):
    import cProfile
    import gc
    import io
    import pstats
    import signal
    import time

    _stem = os.environ["EXACTLY_CPROFILE"].replace("{pid}", str(os.getpid()))  # one file per process
    _state = {"prof": None, "n": 0}
    _gc = {"on": False, "t0": 0.0, "runs": [0, 0, 0], "cpu": [0.0, 0.0, 0.0]}

    def _gc_callback(phase, info):
        if not _gc["on"]:
            return
        if phase == "start":
            _gc["t0"] = time.thread_time()
        else:
            gen = info["generation"]
            _gc["runs"][gen] += 1
            _gc["cpu"][gen] += time.thread_time() - _gc["t0"]

    gc.callbacks.append(_gc_callback)

    def _start(_sig, _frame):
        prof = cProfile.Profile(time.thread_time)
        _state["prof"] = prof
        _gc.update(on=True, runs=[0, 0, 0], cpu=[0.0, 0.0, 0.0])
        prof.enable()

    def _stop(_sig, _frame):
        prof = _state["prof"]
        if prof is None:
            return
        prof.disable()
        _gc["on"] = False
        _state["prof"] = None
        _state["n"] += 1
        path = f"{_stem}-{_state['n']}"
        prof.dump_stats(path + ".pstats")
        out = io.StringIO()
        runs, cpu = _gc["runs"], _gc["cpu"]
        out.write(
            "gc collections by generation: "
            + ", ".join(f"gen{g} {runs[g]} ({cpu[g] * 1e3:.1f} ms CPU)" for g in range(3))
            + "\n"
        )
        stats = pstats.Stats(prof, stream=out)
        stats.sort_stats("tottime").print_stats(300)
        stats.sort_stats("cumulative").print_stats(45)
        with open(path + ".txt", "w") as f:
            f.write(out.getvalue())

    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
