"""What a daemon costs to start and to stop, per object (issue 40, "daemon start and stop cost per object").

Drives :class:`declop.handlers.daemons.DaemonRunner` as the controller does — its supervisor step
with the cached object, its keeper as the background hook — for ``--objects`` objects at once,
with a daemon that only waits for ``stop``. No apiserver: what is measured is declop's part of
a start (the step, the record, the task or thread, the fence's context) and of a stop (the step
of a DELETING object: set ``stop``, await the end, release the range's in-flight count).

- ``start``: ``step()`` for every object, then until every daemon ran its first line;
- ``stop``: ``step(DELETING)`` for every object, one after the other as one worker would; each
  returns only once its daemon ended;
- both as wall time per object (the loop is idle otherwise), median of ``--repeats`` runs, for
  an ``async def`` daemon (a task) and a plain ``def`` (a thread of its own).

    python bench/daemon_cost.py
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from typing import Any

from declop.handlers.daemons import DaemonRunner, daemon_wants
from declop.kube import fencing
from declop.kube.fencing import WriteFence
from declop.kube.keys import Request
from declop.reconcile.result import Phase


class _Ctx:
    pass


class _Client:
    def __init__(self) -> None:
        self._ctx = _Ctx()


async def _run(fn: Any, n: int, ran: Any) -> tuple[float, float]:
    r = DaemonRunner(fn, "bench", wants=daemon_wants(fn, "bench"), stop_timeout=10, backoff=1, initial_delay=None,
                     client_for=lambda c, k, a: c)  # fmt: skip
    client = _Client()
    stop = asyncio.Event()
    keeper = asyncio.create_task(r.keep(client, stop))
    await asyncio.sleep(0)
    keys = [Request("bench", f"obj-{i}") for i in range(n)]
    obj = {"metadata": {"generation": 1}}
    token = fencing.enter(WriteFence(lambda: True, "bench/lease", None))  # a leader-elected call's fence
    try:
        t0 = time.perf_counter()
        for k in keys:
            await r.step(k, obj, Phase.UPDATED, client, None)
        while ran() < n:
            await asyncio.sleep(0.0005)
        started = time.perf_counter() - t0
        t1 = time.perf_counter()
        for k in keys:
            await r.step(k, obj, Phase.DELETING, client, None)
        stopped = time.perf_counter() - t1
    finally:
        fencing.leave(token)
    stop.set()
    await keeper
    return started / n * 1e6, stopped / n * 1e6


def measure(kind: str, n: int) -> tuple[float, float]:
    count = [0]
    lock = threading.Lock()

    async def a_daemon(stop: asyncio.Event) -> None:
        count[0] += 1
        await stop.wait()

    def t_daemon(stop: threading.Event) -> None:
        with lock:
            count[0] += 1
        stop.wait()

    fn = a_daemon if kind == "async def" else t_daemon
    return asyncio.run(_run(fn, n, lambda: count[0]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objects", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    print(f"daemon start and stop cost per object ({args.objects} objects, median of {args.repeats})")
    print(f"{'daemon':<10} {'start µs':>10} {'stop µs':>10}")
    for kind in ("async def", "def"):
        runs = [measure(kind, args.objects) for _ in range(args.repeats)]
        start = statistics.median(s for s, _ in runs)
        stop = statistics.median(s for _, s in runs)
        print(f"{kind:<10} {start:>10.1f} {stop:>10.1f}")


if __name__ == "__main__":
    main()
