"""Instrumentation shared by the Python operators under test (declop, Kopf).

Every operator appends one line per reconcile to ``$BENCH_OUT``:
``<time.time_ns() at handler start> <namespace>/<name> <bench/seq annotation or ->``,
with one unbuffered ``os.write`` (the Go baseline does the same with one ``File.Write``).
The handler blocks only when ``bench/block`` equals ``bench/seq`` (scenario e).
"""

from __future__ import annotations

import asyncio
import os
import time

_FD = os.open(os.environ["BENCH_OUT"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def record(started_ns: int, namespace: str, name: str, annotations: dict | None) -> None:
    ann = annotations or {}
    seq = ann.get("bench/seq") or "-"
    os.write(_FD, f"{started_ns} {namespace}/{name} {seq}\n".encode())
    block = ann.get("bench/block")
    if block and block == ann.get("bench/seq"):
        time.sleep(int(ann.get("bench/block-ms") or 0) / 1000)


def record_missing(started_ns: int, namespace: str, name: str) -> None:
    os.write(_FD, f"{started_ns} {namespace}/{name} -\n".encode())


async def stall_probe(path: str, interval: float = 0.01) -> None:
    """Tick every ``interval`` s on the event loop; write each new maximum lateness to ``path``.

    Line: ``<time.time_ns()> <lateness ms> <loop thread CPU ms> <process CPU ms>``. Lateness = how
    much later than asked the loop woke us: the longest time the loop could not run anything else
    (GC pauses, long callbacks, decoding, the GIL held by a handler thread — or the process not
    scheduled at all on a busy machine: the two CPU figures, over the same tick, tell which).
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    worst = 0.0
    loop = asyncio.get_running_loop()
    while True:
        before, loop_cpu, cpu = loop.time(), time.thread_time(), time.process_time()
        await asyncio.sleep(interval)
        late = (loop.time() - before - interval) * 1000
        if late > worst:
            worst = late
            loop_cpu, cpu = (time.thread_time() - loop_cpu) * 1000, (time.process_time() - cpu) * 1000
            os.write(fd, f"{time.time_ns()} {late:.3f} {loop_cpu:.1f} {cpu:.1f}\n".encode())
