"""Load generators: confluent-kafka (Python) and kcat (C, librdkafka) producers and consumers.

Each driver returns a ``ClientRun``: wall seconds of the timed section, client CPU seconds, records and
payload bytes moved, and error strings.  Broker CPU is measured by the caller around the call.
"""

from __future__ import annotations

import base64
import os
import random
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from benchlib import kafka, procstat

RECORD_SIZE = 1024
POOL = 1024

# Nice value for librdkafka's own threads (rdk:*) in this process, None: left alone.  Set by run.py /
# cluster_ab.py --client-io-nice; applied to every confluent-kafka producer the throughput and
# latency loops create (RF 1, RF 3 and the single broker alike).  Why: an idempotent librdkafka
# producer whose 5 in-flight requests are all out and that has a full batch queued busy-polls in its
# broker thread (poll() with timeout 0, ~30,000 times a second, measured with strace) until an
# answer comes; with the brokers on the same 2-core box that spin takes the CPU the brokers need
# to answer.  A niced spin only gets the CPU nobody else wants.  The Python loop is not affected.
CLIENT_IO_NICE: int | None = None


def deprioritise_io_threads(nice: int | None = None) -> int:
    """Set the nice value of this process's librdkafka threads (``rdk:*``, Linux) to ``nice``
    (default ``CLIENT_IO_NICE``); returns how many were changed."""
    nice = CLIENT_IO_NICE if nice is None else nice
    if nice is None:
        return 0
    changed = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if not f.read().startswith("rdk:"):
                    continue
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)
            changed += 1
        except OSError:  # the thread ended meanwhile
            continue
    return changed


PRODUCE_CONF: dict[str, object] = {
    "acks": "all",
    "enable.idempotence": True,
    "linger.ms": 10,
    # librdkafka's own cap is message.max.bytes (1,000,000): a ~1 MB batch, under Kafka's default
    # broker limit of 1,048,588 bytes per batch.
    "batch.size": 1_000_000,
    "compression.type": "none",
}


# librdkafka stops fetching for fetch.queue.backoff.ms (default 1000 ms) once its local queue exceeds
# queued.max.messages.kbytes (64 MB): with a broker faster than the application that is up to a second of
# idle time per 64 MB, i.e. the figure would measure the backoff timer.  Both clients resume after 5 ms.
CONSUME_CONF: dict[str, object] = {"fetch.queue.backoff.ms": 5}


@dataclass
class ClientRun:
    wall_s: float = 0.0
    client_cpu_s: float = 0.0
    records: int = 0
    bytes: int = 0
    errors: list[str] = field(default_factory=list)
    extra: dict[str, float] = field(default_factory=dict)


def payload_pool(size: int = RECORD_SIZE, count: int = POOL, seed: int = 42) -> list[bytes]:
    """``count`` distinct printable, newline-free, incompressible-ish values of exactly ``size`` bytes."""
    rnd = random.Random(seed)
    out = []
    for _ in range(count):
        raw = rnd.randbytes(size)
        out.append(base64.b64encode(raw)[:size].replace(b"/", b"_").replace(b"+", b"-"))
    return out


def write_lines_file(path: Path, records: int, pool: list[bytes]) -> Path:
    """The kcat -l input: ``records`` lines, each one pool value (delimiter not part of the record)."""
    if path.exists() and path.stat().st_size == records * (len(pool[0]) + 1):
        return path
    with open(path, "wb", buffering=8 << 20) as f:
        block = b"\n".join(pool) + b"\n"
        full, rest = divmod(records, len(pool))
        for _ in range(full):
            f.write(block)
        for i in range(rest):
            f.write(pool[i] + b"\n")
    return path


# ---------------------------------------------------------------------------------------- confluent


def confluent_produce(
    bootstrap: str,
    topic: str,
    records: int,
    pool: list[bytes],
    timeout: float,
    conf: dict[str, object] | None = None,
    warmup_topic: str | None = None,
    txn_interval_s: float | None = None,
) -> ClientRun:
    """Produce ``records`` pool values as fast as the Python loop goes; the clock stops when every record
    is acked.  With ``txn_interval_s`` (``conf`` must set ``transactional.id``) the producer runs
    transactions: ``init_transactions()`` before the clock, then begin / produce / ``commit_transaction()``
    once ``txn_interval_s`` has passed since the transaction began (checked every 256 records, in both modes
    so the loops are the same), and a last commit at the end.  ``commit_transaction()`` blocks until every
    record of the transaction is acked and EndTxn answered, as in every Kafka client."""
    run = ClientRun()
    errors: list[str] = []

    def on_error(err: KafkaError, msg: object) -> None:  # only called on failure (see config)
        if err is not None and len(errors) < 20:
            errors.append(str(err))

    cfg: dict[str, object] = {
        "bootstrap.servers": bootstrap,
        **PRODUCE_CONF,
        **kafka.QUIET,
        "delivery.report.only.error": True,
        "on_delivery": on_error,
    }
    cfg.update(conf or {})
    txn = txn_interval_s is not None
    p = Producer(cfg)
    p.list_topics(topic, timeout=30)  # connect + metadata before the clock starts
    deprioritise_io_threads()
    if txn:
        p.init_transactions(60)
    if warmup_topic:
        # one acked record elsewhere, so the producer id is in hand before the clock starts (librdkafka's
        # PID state machine otherwise may sit on a fixed 500 ms retry timer at startup)
        if txn:
            p.begin_transaction()
        p.produce(warmup_topic, b"warmup")
        if txn:
            p.commit_transaction(30)
        elif p.flush(30):
            errors.append("warm-up record not acked")
    n_pool = len(pool)
    produce, poll, clock = p.produce, p.poll, time.perf_counter
    c0, t0 = procstat.self_cpu_seconds(), clock()
    deadline = time.monotonic() + timeout
    interval = txn_interval_s if txn_interval_s is not None else float("inf")
    commits = 0
    commit_s = flush_s = worst = 0.0
    if txn:
        p.begin_transaction()
    next_commit = clock() + interval
    i = 0
    try:
        while i < records:
            try:
                produce(topic, pool[i % n_pool])
            except BufferError:
                if time.monotonic() > deadline:
                    errors.append("timeout while queue full")
                    break
                poll(0.005)
                continue
            i += 1
            if not i & 0xFF:
                now = clock()
                if now >= next_commit:
                    # flush() first (commit_transaction() would flush anyway) to split the commit into
                    # draining the in-flight records and the EndTxn round trip
                    p.flush(max(1.0, deadline - time.monotonic()))
                    t_flushed = clock()
                    p.commit_transaction(max(1.0, deadline - time.monotonic()))
                    commits += 1
                    t_begin = clock()
                    flush_s += t_flushed - now
                    commit_s += t_begin - now
                    worst = max(worst, t_begin - now)
                    p.begin_transaction()
                    next_commit = t_begin + interval
                if not i & 0x3FFF:
                    poll(0)
        now = clock()
        left = p.flush(max(1.0, deadline - time.monotonic()))
        t_flushed = clock()
        flush_s += t_flushed - now
        if txn:
            p.commit_transaction(max(1.0, deadline - time.monotonic()))
            commits += 1
            commit_s += clock() - now
            worst = max(worst, clock() - now)
    except KafkaException as exc:
        errors.append(f"transaction failed: {exc}")
        left = len(p)
    run.wall_s = clock() - t0
    run.client_cpu_s = procstat.self_cpu_seconds() - c0
    if left:
        errors.append(f"{left} records still undelivered at timeout")
    run.records = i - left
    run.bytes = run.records * len(pool[0])
    run.errors = errors
    run.extra["flush_s"] = flush_s  # idempotent: the final flush only
    if txn:
        run.extra.update(
            {
                "commits": commits,
                "commit_s": commit_s,
                "endtxn_s": commit_s - flush_s,
                "commit_max_ms": 1000 * worst,
                "txn_ms": 1000 * run.wall_s / max(1, commits),
            }
        )
    return run


def marked_pool(pool: list[bytes], mark: bytes) -> list[bytes]:
    """``pool`` with the first byte of every value replaced by ``mark`` (b"C" committed, b"A" aborted)."""
    return [mark + v[1:] for v in pool]


def confluent_txn_fill(
    bootstrap: str,
    topic: str,
    records: int,
    pool: list[bytes],
    txn_records: int = 1000,
    abort_every: int = 3,
    timeout: float = 600.0,
) -> tuple[int, int, int, list[str]]:
    """Fill ``topic`` with ``records`` records in transactions of ``txn_records`` records; every
    ``abort_every``-th transaction is aborted *after* ``flush()``, so its records really are in the log
    (librdkafka purges records not yet sent when a transaction aborts).  Committed values and keys start
    with b"C", aborted ones with b"A" (keys: the letter and the record's number).  Returns (committed, aborted, transactions, errors)."""
    committed_pool, aborted_pool = marked_pool(pool, b"C"), marked_pool(pool, b"A")
    errors: list[str] = []

    def on_delivery(err: KafkaError, msg: object) -> None:
        if err is not None and len(errors) < 20:
            errors.append(str(err))

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            **PRODUCE_CONF,
            **kafka.QUIET,
            "transactional.id": f"bench-fill-{topic}",
            "delivery.report.only.error": True,
            "on_delivery": on_delivery,
        }
    )
    p.init_transactions(60)
    deadline = time.monotonic() + timeout
    committed = aborted = txns = i = 0
    n_pool = len(pool)
    for t in range(records // txn_records + 1):
        n = min(txn_records, records - i)
        if n <= 0:
            break
        abort = t % abort_every == abort_every - 1
        src = aborted_pool if abort else committed_pool
        p.begin_transaction()
        j = 0
        key_prefix = b"A" if abort else b"C"
        while j < n:
            try:
                # the key marks the record for kcat (-f %k); digits spread keys over partitions
                p.produce(topic, src[(i + j) % n_pool], key_prefix + str(i + j).encode())
                j += 1
            except BufferError:
                p.poll(0.005)
            if time.monotonic() > deadline:
                raise RuntimeError(f"filling {topic}: timeout")
        if abort:
            left = p.flush(60)  # every record acked, i.e. in the log, before the abort marker
            if left:
                errors.append(f"{left} records unacked before abort")
            p.abort_transaction(60)
            aborted += n
        else:
            p.commit_transaction(60)
            committed += n
        i += n
        txns += 1
    return committed, aborted, txns, errors


def _preconnect(c: Consumer, topic: str, partitions: int) -> None:
    """Metadata plus one ListOffsets per partition before the clock starts, so the connection to the
    partition leader is up: otherwise librdkafka's first offset query finds no usable leader connection
    and retries on a ~500 ms timer, which would be timed as part of the consume."""
    c.list_topics(topic, timeout=30)
    for p in range(partitions):
        c.get_watermark_offsets(TopicPartition(topic, p), timeout=30, cached=False)


def confluent_consume(
    bootstrap: str,
    topic: str,
    partitions: int,
    expected: int,
    timeout: float,
    conf: dict[str, object] | None = None,
) -> ClientRun:
    run = ClientRun()
    c = kafka.consumer(bootstrap, {**CONSUME_CONF, **(conf or {})})
    try:
        _preconnect(c, topic, partitions)
        c0, t0 = procstat.self_cpu_seconds(), time.perf_counter()
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        deadline = time.monotonic() + timeout
        count = nbytes = 0
        consume = c.consume
        while count < expected:
            if time.monotonic() > deadline:
                run.errors.append(f"timeout after {count}/{expected} records")
                break
            for m in consume(num_messages=10_000, timeout=0.2):
                if m.error() is not None:
                    if len(run.errors) < 20:
                        run.errors.append(str(m.error()))
                    continue
                count += 1
                nbytes += len(m.value())
        run.wall_s = time.perf_counter() - t0
        run.client_cpu_s = procstat.self_cpu_seconds() - c0
        run.records, run.bytes = count, nbytes
    finally:
        c.close()
    return run


def confluent_consume_to_eof(
    bootstrap: str,
    topic: str,
    partitions: int,
    expected: int,
    timeout: float,
    conf: dict[str, object] | None = None,
    mark: int = ord("A"),
) -> ClientRun:
    """Read ``topic`` from offset 0 until every partition reports end-of-partition (so records beyond
    ``expected`` would be seen), counting records whose value starts with byte ``mark`` (the aborted ones
    of a ``confluent_txn_fill`` topic) in ``extra["marked"]``.  The clock stops at the ``expected``-th
    record (or at the last end-of-partition if fewer arrive): the end-of-partition signal itself waits on
    librdkafka's fetch cadence and is reported as ``extra["eof_s"]``."""
    run = ClientRun()
    c = kafka.consumer(bootstrap, {**CONSUME_CONF, **(conf or {}), "enable.partition.eof": True})
    try:
        _preconnect(c, topic, partitions)
        c0, t0 = procstat.self_cpu_seconds(), time.perf_counter()
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        deadline = time.monotonic() + timeout
        count = nbytes = marked = 0
        t_done: float | None = None
        at_eof: set[int] = set()
        consume = c.consume
        eof_code = KafkaError._PARTITION_EOF
        while len(at_eof) < partitions:
            if time.monotonic() > deadline:
                run.errors.append(f"timeout after {count}/{expected} records")
                break
            for m in consume(num_messages=10_000, timeout=0.2):
                err = m.error()
                if err is not None:
                    if err.code() == eof_code:
                        at_eof.add(m.partition())
                    elif len(run.errors) < 20:
                        run.errors.append(str(err))
                    continue
                v = m.value()
                count += 1
                nbytes += len(v)
                if v[0] == mark:
                    marked += 1
            if t_done is None and count >= expected:
                t_done = time.perf_counter()
        t_eof = time.perf_counter()
        run.wall_s = (t_done or t_eof) - t0
        run.client_cpu_s = procstat.self_cpu_seconds() - c0
        run.records, run.bytes = count, nbytes
        run.extra.update({"marked": marked, "eof_s": t_eof - t0})
    finally:
        c.close()
    return run


def confluent_first_assignment(
    bootstrap: str, topic: str, group: str, timeout: float = 90.0
) -> tuple[float | None, int, list[str]]:
    """A fresh consumer joins ``group``: seconds from ``subscribe()`` to the first assignment callback
    (connection and metadata are set up before the clock starts), and the number of partitions assigned."""
    errors: list[str] = []
    got: list[tuple[float, int]] = []
    c = kafka.consumer(bootstrap, {"group.id": group, "auto.offset.reset": "earliest"})
    try:
        c.list_topics(topic, timeout=30)
        t0 = time.perf_counter()

        def on_assign(consumer: object, parts: list[TopicPartition]) -> None:
            got.append((time.perf_counter() - t0, len(parts)))

        c.subscribe([topic], on_assign=on_assign)
        deadline = time.monotonic() + timeout
        while not got:
            if time.monotonic() > deadline:
                errors.append(f"no assignment within {timeout:.0f} s")
                break
            m = c.poll(0.005)
            if m is not None and m.error() is not None and len(errors) < 10:
                errors.append(str(m.error()))
    finally:
        c.close()
    if not got:
        return None, 0, errors
    return got[0][0], got[0][1], errors


# --------------------------------------------------------------------------------------------- kcat


def kcat_env(mode: str, scratch: Path) -> dict[str, str]:
    """Environment for kcat.  ``bundled``: run Debian's kcat against the librdkafka that confluent-kafka
    ships (same client library as the Python driver; Debian's 2.0.2 cannot parse Tansu's ApiVersions
    v3 response).  ``system``: Debian's own librdkafka."""
    env = dict(os.environ)
    env["BENCH_KCAT_LIB"] = mode
    # kcat copies every record into a fresh malloc() block; glibc trimming the heap back after each
    # batch makes it re-fault the same pages (most of its CPU is page clearing).  Keep the heap.
    env["GLIBC_TUNABLES"] = "glibc.malloc.top_pad=268435456:glibc.malloc.trim_threshold=1073741824"
    if mode == "system":
        return env
    import confluent_kafka

    libs = sorted(Path(confluent_kafka.__file__).parent.parent.glob("confluent_kafka.libs/librdkafka-*.so.1"))
    if not libs:
        env["BENCH_KCAT_LIB"] = "system"
        return env
    d = scratch / "rdkafka"
    d.mkdir(parents=True, exist_ok=True)
    link = d / "librdkafka.so.1"
    if not link.exists():
        link.symlink_to(libs[-1])
    env["LD_LIBRARY_PATH"] = str(d) + (
        os.pathsep + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else ""
    )
    return env


def kcat_version(env: dict[str, str]) -> str:
    try:
        out = subprocess.run(["kcat", "-V"], capture_output=True, text=True, env=env, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable ({exc})"
    m = re.search(r"Version (\S+) .*librdkafka (\S+)", out.stdout + out.stderr)
    return f"kcat {m.group(1)} / librdkafka {m.group(2)}" if m else "kcat ?"


def _wait_rusage(proc: subprocess.Popen[bytes], deadline: float) -> tuple[int, float]:
    """Wait for ``proc`` (killing it at ``deadline``); return (exit code, its user+sys CPU seconds)."""
    for _ in range(10_000_000):
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, ru.ru_utime + ru.ru_stime
        if time.monotonic() > deadline:
            proc.kill()
            _, status, ru = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            return -9, ru.ru_utime + ru.ru_stime
        time.sleep(0.002)
    raise RuntimeError("unreachable")


def kcat_produce(
    bootstrap: str,
    topic: str,
    lines_file: Path,
    records: int,
    record_size: int,
    timeout: float,
    env: dict[str, str],
    conf: dict[str, object] | None = None,
    preroll: float = 1.0,
) -> ClientRun:
    """kcat -P -l FIFO: kcat starts, connects and (idempotence) gets its producer id during ``preroll``
    seconds -- librdkafka's PID state machine retries on a fixed 500 ms timer when it starts before the
    broker connection is up, which would otherwise add ~0.5 s to every run.  The clock starts when we
    start feeding the records file into the FIFO and stops when kcat exits (all records acked)."""
    run = ClientRun()
    cfg = {**PRODUCE_CONF, **(conf or {})}
    fifo = lines_file.parent / f"kcat-{topic}.fifo"
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    cmd = ["kcat", "-P", "-b", bootstrap, "-t", topic, "-l", str(fifo), "-c", str(records)]
    for k, v in cfg.items():
        cmd += ["-X", f"{k}={str(v).lower() if isinstance(v, bool) else v}"]
    err_path = lines_file.parent / f"kcat-{topic}.err"
    to_send = records * (record_size + 1)
    try:
        with open(err_path, "wb") as err:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env
            )
            deadline = time.monotonic() + timeout
            time.sleep(preroll)
            t0 = time.perf_counter()
            wfd = -1
            for _ in range(100_000):  # kcat opens the FIFO for reading; O_NONBLOCK open fails until then
                try:
                    wfd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        break
                    time.sleep(0.001)
            if wfd >= 0:
                os.set_blocking(wfd, True)
                try:
                    with open(lines_file, "rb") as src:
                        sent = 0
                        for _ in range(10_000_000):
                            if sent >= to_send:
                                break
                            n = os.sendfile(wfd, src.fileno(), sent, min(1 << 20, to_send - sent))
                            if n == 0:
                                break
                            sent += n
                except BrokenPipeError:
                    run.errors.append("kcat closed its input early")
                finally:
                    os.close(wfd)
            rc, cpu = _wait_rusage(proc, deadline)
            run.wall_s = time.perf_counter() - t0
    finally:
        fifo.unlink(missing_ok=True)
    run.client_cpu_s = cpu
    text = err_path.read_text(errors="replace")
    err_path.unlink(missing_ok=True)
    if rc != 0:
        run.errors.append(f"kcat exit {rc}: {text[-500:]}")
    else:
        # librdkafka's own "...: retrying" warning when the bootstrap connection it asked for a
        # producer id on is replaced by the broker's real one is not a failure: it asks again
        lines = [
            ln for ln in text.splitlines() if not (ln.startswith("%4|") and ln.rstrip().endswith("retrying"))
        ]
        if any("fail" in ln.lower() or "error" in ln.lower() for ln in lines):
            run.errors.append(f"kcat stderr: {text[-500:]}")
    run.records = records  # what we asked for; the caller verifies against the log
    run.bytes = records * record_size
    return run


def kcat_consume(
    bootstrap: str,
    topic: str,
    expected: int,
    record_size: int,
    timeout: float,
    env: dict[str, str],
    conf: dict[str, object] | None = None,
    mark: bytes | None = None,
) -> ClientRun:
    """kcat -C -e from the beginning, printing only offsets (or, with ``mark``, keys): we count lines (one
    per record) and, with ``mark``, the records whose key holds that byte (``extra["marked"]``)."""
    run = ClientRun()
    fmt = "%k\n" if mark else "%o\n"
    cmd = ["kcat", "-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e", "-q", "-f", fmt]
    base = CONSUME_CONF if env.get("BENCH_KCAT_LIB") == "bundled" else {}  # 2.0.2 lacks the property
    for k, v in {**base, **(conf or {})}.items():
        cmd += ["-X", f"{k}={v}"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert proc.stdout is not None and proc.stderr is not None
    deadline = time.monotonic() + timeout
    watchdog = threading.Timer(timeout, proc.kill)  # a hung kcat must not hang the harness
    watchdog.start()
    lines = marked = 0
    t_done = None
    try:
        for _ in range(100_000_000):
            chunk = proc.stdout.read1(1 << 20)
            if not chunk:
                break
            lines += chunk.count(b"\n")
            if mark:
                marked += chunk.count(mark)
            if t_done is None and expected and lines >= expected:
                # the clock stops at the last record; kcat then still waits for end-of-partition,
                # which a broker may delay by fetch.wait.max.ms
                t_done = time.perf_counter()
    finally:
        watchdog.cancel()
    if lines < expected and time.monotonic() > deadline:
        run.errors.append(f"timeout after {lines}/{expected} records")
    rc, cpu = _wait_rusage(proc, deadline + 10)
    t_exit = time.perf_counter()
    run.wall_s = (t_done or t_exit) - t0
    run.extra["exit_s"] = t_exit - t0
    if mark:
        run.extra["marked"] = marked
    stderr = proc.stderr.read().decode(errors="replace")
    run.client_cpu_s = cpu
    if rc != 0:
        run.errors.append(f"kcat exit {rc}: {stderr[-500:]}")
    run.records = lines
    run.bytes = lines * record_size
    return run
