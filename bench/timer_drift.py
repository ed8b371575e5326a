"""Timer drift at 1,000 objects (issue 40): how late do ticks fire, and does lateness accumulate?

In-process, no apiserver (it measures the timer runner and the controller pipeline it rides on,
not the API): ``--objects`` ConfigMaps sit in a fake informer, their ``creationTimestamp``s spread
over the ``--interval`` before the start (so ticks are due all the time, not in one burst); one
``@declop.timer`` with that interval runs through the ordinary :class:`Controller` (queue → worker
→ thread pool for ``def``, the loop for ``async def``) for ``--seconds``. The handler does nothing
but sleep ``--handler-ms``. Row per handler kind: ticks fired vs the grid points due in the window,
the median, p99 and max lateness of the ticks (seconds from the grid point to the call, as the
runner measures it), and the lateness of the last third of the run against the first third (drift
would make the later ticks later).

    python bench/timer_drift.py --objects 1000 --interval 2 --seconds 20 --out bench/results/<dir>
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import csv
import datetime
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import declop
from declop.handlers.timers import TimerRunner


class _Ctx:
    transport = None
    recorder = None


def quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))] if s else float("nan")


async def run(kind: str, objects: int, interval: float, seconds: float, handler_ms: float) -> dict[str, Any]:
    from declop.cache.store import Store, Writer
    from declop.kube.discovery import ResourceInfo
    from declop.reconcile.controller import Controller, Source
    from declop.reconcile.mapping import enqueue_self

    cm = ResourceInfo(group="", version="v1", plural="configmaps", kind="ConfigMap", namespaced=True)

    class Informer:
        def __init__(self) -> None:
            self.store = Store("configmaps")
            self.writer = Writer(self.store)
            self.namespace, self.name, self.last_error = "", "configmaps", ""
            self.synced = asyncio.Event()
            self.resource, self.syncing, self.lists = cm, False, 1

        def subscribe(self, handler: Any) -> None:
            pass

    registry = declop.registry.Registry()

    if kind == "def":

        def tick(name: str) -> None:
            if handler_ms:
                time.sleep(handler_ms / 1000)

    else:

        async def tick(name: str) -> None:  # type: ignore[misc]
            if handler_ms:
                await asyncio.sleep(handler_ms / 1000)

    registry.timer("configmaps", interval=interval)(tick)
    reg = registry.registrations[0]
    runner: TimerRunner = reg.fn.__self__  # type: ignore[attr-defined]
    informer = Informer()
    pool = concurrent.futures.ThreadPoolExecutor(2)
    c = Controller(reg, cm, [Source((informer,), enqueue_self, primary=True)], _Ctx(), executor=pool)  # type: ignore[arg-type]
    on_event = c.subscriber(c.sources[0])
    rng = random.Random(1)
    now = time.time()
    anchors = []
    informer.syncing = True
    for i in range(objects):
        # whole seconds, as the apiserver writes them; spread so that points fall due all the time
        created = int(now - 60 - rng.uniform(0, interval))
        anchors.append(float(created))
        stamp = datetime.datetime.fromtimestamp(created, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        obj = {"metadata": {"name": f"cm-{i}", "namespace": "b", "uid": f"u{i}", "resourceVersion": "1", "creationTimestamp": stamp}}
        old, new = informer.writer.upsert(obj)
        on_event(old, new)
    informer.syncing = False
    start = time.time()
    worker = asyncio.ensure_future(c._worker())
    await asyncio.sleep(seconds)
    end = time.time()
    c.queue.shutdown()
    await asyncio.wait_for(worker, 60)
    pool.shutdown()
    late = list(runner.lateness)
    third = max(1, len(late) // 3)
    # a replica fires the grid points at or after it took the key (about the start) up to the end
    due = sum(math.floor((end - a) / interval) - math.ceil((start - a) / interval) + 1 for a in anchors)
    return {
        "handler": kind, "objects": objects, "interval_s": interval, "window_s": seconds, "handler_ms": handler_ms,
        "ticks": runner.fired, "grid_points_due": due,
        "lateness_p50_ms": round(statistics.median(late) * 1000, 2) if late else float("nan"),
        "lateness_p99_ms": round(quantile(late, 0.99) * 1000, 2),
        "lateness_max_ms": round(max(late) * 1000, 2) if late else float("nan"),
        "first_third_p50_ms": round(statistics.median(late[:third]) * 1000, 2) if late else float("nan"),
        "last_third_p50_ms": round(statistics.median(late[-third:]) * 1000, 2) if late else float("nan"),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--objects", type=int, default=1000)
    p.add_argument("--interval", type=float, default=2.0)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--handler-ms", type=float, default=0.0)
    p.add_argument("--kinds", default="def,async")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    rows = []
    for kind in a.kinds.split(","):
        rows.append(asyncio.run(run(kind, a.objects, a.interval, a.seconds, a.handler_ms)))
        print(rows[-1], flush=True)
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        with open(a.out / "timer_drift.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
