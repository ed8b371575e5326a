"""The in-process cost of one watch event, from the decoded line to the handler, without an
apiserver — for before/after pairs of a change on the hot path (issue 16: priorities and
reconcile provenance).

What runs is declop's own per-event path, as the informer drives it: ``loads(line)`` → the
cache's ``Writer.upsert`` → the controller's subscriber (predicates, priority, trigger) → the
queue → a worker → the handler (a no-op plain ``def``, defaults, ``max_concurrent=1``), over
1,000 cached 6 KB ConfigMaps, with the manager's real Prometheus metrics. Two figures:

- **CPU per update** (µs; ×1000/1e6 = cores per 1k updates/s): one MODIFIED event at a time, the
  next once the previous one was reconciled (no coalescing), an inline executor so only declop's
  Python is counted; min of ``--reps`` repetitions of ``--events`` events;
- **p99 event → handler** (ms): events paced at ``--rate``/s for ``--seconds``, the handler in the
  real thread pool, latency from the event's arrival to the handler's start.

Each tree runs in its own process (``PYTHONPATH=<tree>``), alternating, ``--pairs`` times:

    python bench/event_cost.py --before /tmp/before --after . --pairs 3
    python bench/event_cost.py --one            # measure the declop on PYTHONPATH, print JSON
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

OBJECTS = 1000


class Ctx:
    transport = None
    recorder = None


class Inline(concurrent.futures.Executor):
    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        future.set_result(fn(*args, **kwargs))
        return future


async def measure(events: int, reps: int, rate: float, seconds: float) -> dict[str, Any]:
    import declop
    from declop.cache.store import Store, Writer
    from declop.reconcile.controller import Controller, Source
    from declop.kube.discovery import ResourceInfo
    from declop.reconcile.mapping import enqueue_self
    from declop.serving.metrics import Metrics
    from declop.kube.transport import loads

    cm = ResourceInfo(group="", version="v1", plural="configmaps", kind="ConfigMap", namespaced=True)

    class FakeInformer:
        def __init__(self) -> None:
            self.store = Store("configmaps")
            self.writer = Writer(self.store)
            self.namespace, self.name, self.last_error = "", "configmaps", ""
            self.synced = asyncio.Event()
            self.resource, self.syncing, self.lists = cm, False, 1

        def subscribe(self, handler: Any) -> None:
            pass

    seen: dict[str, list[float]] = {}
    calls = 0

    def handler(request: Any, **_: Any) -> None:
        nonlocal calls
        calls += 1
        seen.setdefault(request.name, []).append(time.perf_counter())

    data = {f"k{i}": os.urandom(500).hex() for i in range(6)}

    def obj(i: int, rv: int) -> dict[str, Any]:
        return {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"obj-{i}", "namespace": "b", "resourceVersion": str(rv), "uid": f"u{i}",
                         "annotations": {"bench/seq": str(rv)}},
            "data": data,
        }

    lines = [json.dumps({"type": "MODIFIED", "object": obj(i % OBJECTS, 1000 + i)}).encode() for i in range(max(events, int(rate * seconds)))]

    async def pipeline(executor: concurrent.futures.Executor) -> tuple[Any, Any, Any]:
        registry = declop.registry.Registry()
        fifo = {"priority": False} if os.environ.get("BENCH_FIFO") == "1" else {}  # a tree with the option
        registry.reconciler("configmaps", **fifo)(handler)
        informer = FakeInformer()
        for i in range(OBJECTS):
            informer.writer.upsert(obj(i, 1))
        c = Controller(registry.registrations[0], cm, [Source((informer,), enqueue_self, primary=True)], Ctx(), executor=executor, metrics=Metrics())  # type: ignore[arg-type]
        c.synced.set()
        return c, informer, c.subscriber(c.sources[0])

    # CPU per update, one at a time
    c, informer, on_event = await pipeline(Inline())
    worker = asyncio.ensure_future(c._worker())
    cpu: list[float] = []
    for _ in range(reps):
        start, t = calls, time.process_time()
        for i in range(events):
            event = loads(lines[i])
            old, new = informer.writer.upsert(event["object"])
            on_event(old, new)
            while calls < start + i + 1:
                await asyncio.sleep(0)
        cpu.append((time.process_time() - t) / events * 1e6)
    c.queue.shutdown()
    await worker

    # p99 event -> handler start, paced, real thread pool
    pool = concurrent.futures.ThreadPoolExecutor(3)
    c, informer, on_event = await pipeline(pool)
    worker = asyncio.ensure_future(c._worker())
    seen.clear()
    arrived: list[tuple[str, float]] = []
    n = int(rate * seconds)
    t0 = time.perf_counter()
    for i in range(n):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        now = time.perf_counter()
        event = loads(lines[i])
        old, new = informer.writer.upsert(event["object"])
        on_event(old, new)
        arrived.append((new["metadata"]["name"], now))
    await asyncio.sleep(0.5)
    c.queue.shutdown()
    await worker
    pool.shutdown()
    # an update's latency: until the first handler start of its key after it (coalesced included)
    latencies = []
    for name, t in arrived:
        starts = seen.get(name, [])
        i = bisect.bisect_left(starts, t)
        if i < len(starts):
            latencies.append(starts[i] - t)
    latencies.sort()
    p99 = latencies[int(len(latencies) * 0.99) - 1] * 1e3 if latencies else float("nan")
    return {"cpu_us_per_update": min(cpu), "cpu_runs": cpu, "p99_ms": p99, "p50_ms": statistics.median(latencies) * 1e3 if latencies else float("nan")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path)
    ap.add_argument("--after", type=Path)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--events", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--one", action="store_true", help="measure the declop on PYTHONPATH and print JSON")
    ap.add_argument("--after-fifo", action="store_true", help="also the after tree with priority=False (provenance alone)")
    args = ap.parse_args()
    if args.one:
        print(json.dumps(asyncio.run(measure(args.events, args.reps, args.rate, args.seconds))))
        return 0
    assert args.before and args.after, "--before and --after (or --one)"
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    if args.after_fifo:
        trees["after-fifo"] = args.after.resolve()
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for p in range(args.pairs):
        for name in (list(trees) if p % 2 == 0 else list(reversed(trees))):  # alternate who goes first
            out = subprocess.run(
                [sys.executable, __file__, "--one", "--events", str(args.events), "--reps", str(args.reps),
                 "--rate", str(args.rate), "--seconds", str(args.seconds)],
                env={**os.environ, "PYTHONPATH": str(trees[name]), "BENCH_FIFO": "1" if name == "after-fifo" else "0"},
                capture_output=True, text=True, check=True,
            )
            results[name].append(json.loads(out.stdout))
            r = results[name][-1]
            print(f"pair {p + 1} {name:<6} cpu {r['cpu_us_per_update']:.1f} µs/update   p50 {r['p50_ms']:.2f} ms   p99 {r['p99_ms']:.2f} ms", flush=True)
    for name, rs in results.items():
        cpu = statistics.median(r["cpu_us_per_update"] for r in rs)
        p99 = statistics.median(r["p99_ms"] for r in rs)
        print(f"median {name:<6} cpu {cpu:.1f} µs/update = {cpu / 1000:.4f} cores per 1k updates/s   p99 {p99:.2f} ms")
    b = statistics.median(r["cpu_us_per_update"] for r in results["before"])
    pb = statistics.median(r["p99_ms"] for r in results["before"])
    for name in list(trees)[1:]:
        a = statistics.median(r["cpu_us_per_update"] for r in results[name])
        pa = statistics.median(r["p99_ms"] for r in results[name])
        print(f"change {name}: cpu {100 * (a - b) / b:+.1f} %   p99 {100 * (pa - pb) / pb:+.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
