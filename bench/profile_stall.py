"""Profile the longest event-loop stall of one informer's sync at N objects, without a cluster.

A scripted fake list/watch server (declop.testing.ListWatchServer) holding N ConfigMaps runs in a
child process (so its own JSON work does not stall the measured loop); this process runs one
Informer against it plus a stall monitor: a task that records the gaps between
``asyncio.sleep(0.005)`` wake-ups, with the time each gap ended. The informer's sync phases are
timed too (list/stream received, swap, emit), so the longest gap can be attributed.

    python bench/profile_stall.py --n 100000 --mode stream|paged [--relist]

``--relist`` also measures a relist (every object changed) after the first sync.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import declop.cache.listing
import declop.collector
import declop.cache.watch
from declop.cache.informer import Informer
from declop.cache.listing import Sync
from declop.testing.fakes.listwatch import ListWatchServer
from declop.kube.transport import Transport


def _serve(n: int, port_q: Any, cmd_q: Any) -> None:
    async def main() -> None:
        async with ListWatchServer() as server:
            for i in range(n):
                obj = server.add(f"cm-{i:06d}", {f"k{j}": f"value-{i}-{j}" for j in range(4)})
                obj["metadata"]["labels"] = {"app": "bench", "shard": str(i % 10)}
                obj["metadata"]["annotations"] = {"bench/seq": str(i)}
            server._state.history.clear()
            _fast_pages(server)
            port_q.put(server.port)
            loop = asyncio.get_running_loop()
            while True:
                cmd = await loop.run_in_executor(None, cmd_q.get)
                if cmd == "relist":
                    for i, o in enumerate(server._state.objects.values()):
                        o["metadata"]["resourceVersion"] = str(10_000_000 + i)
                    server.compact()
                    port_q.put("ok")
                elif cmd == "stop":
                    return

    asyncio.run(main())


def _fast_pages(server: ListWatchServer) -> None:
    """Serve LIST pages from a sorted snapshot cached per resourceVersion (the fake server sorts
    all objects for every page, minutes at 100k: a cost of the fake, not of the informer)."""
    from aiohttp import web

    cache: dict[str, list[Any]] = {}

    def _list(query: dict[str, str], step: Any) -> web.Response:
        rv = server.resource_version
        items = cache.get(rv)
        if items is None:
            cache.clear()
            objs = sorted(server._state.objects.values(), key=lambda o: o["metadata"]["name"])
            items = cache[rv] = [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in objs]
        start, limit = int(query.get("continue") or 0), int(query.get("limit") or 0)
        meta: dict[str, Any] = {"resourceVersion": rv}
        if limit and start + limit < len(items):
            meta["continue"] = str(start + limit)
            page = items[start : start + limit]
        else:
            page = items[start:]
        return web.json_response({"kind": "ConfigMapList", "apiVersion": "v1", "metadata": meta, "items": page})

    server._list = _list  # type: ignore[method-assign]


class Monitor:
    def __init__(self) -> None:
        self.gaps: list[tuple[float, float]] = []  # (gap ms, time it ended)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(0.005)
            now = loop.time()
            self.gaps.append(((now - before - 0.005) * 1000, now))

    def worst(self, since: float, k: int = 5) -> list[tuple[float, float]]:
        return sorted((g for g in self.gaps if g[1] >= since), reverse=True)[:k]


def _wrap_phases(marks: list[tuple[str, float]]) -> None:
    """Time the informer's sync phases by wrapping its Sync's methods (declop itself is unchanged)."""
    for name in ("replace", "emit_all"):
        orig = getattr(Sync, name)
        if asyncio.iscoroutinefunction(orig):
            async def wrapped(self: Any, *a: Any, __orig: Any = orig, __name: str = name) -> Any:
                marks.append((f"{__name} start", asyncio.get_running_loop().time()))
                try:
                    return await __orig(self, *a)
                finally:
                    marks.append((f"{__name} end", asyncio.get_running_loop().time()))
        else:
            def wrapped(self: Any, *a: Any, __orig: Any = orig, __name: str = name) -> Any:  # type: ignore[misc]
                marks.append((f"{__name} start", asyncio.get_running_loop().time()))
                try:
                    return __orig(self, *a)
                finally:
                    marks.append((f"{__name} end", asyncio.get_running_loop().time()))
        setattr(Sync, name, wrapped)
    orig = declop.collector.freeze

    def wrapped_f(*a: Any, __orig: Any = orig) -> Any:
        t = time.perf_counter()
        r = __orig(*a)
        marks.append((f"_freeze took {1000 * (time.perf_counter() - t):.1f} ms", asyncio.get_running_loop().time()))
        return r
    declop.collector.freeze = wrapped_f  # a paged list's pages and a stream's chunks call it through the module


async def measure(n: int, mode: str, relist: bool, port_q: Any, cmd_q: Any) -> None:
    port = await asyncio.get_running_loop().run_in_executor(None, port_q.get)
    server = ListWatchServer()
    server.port = port
    transport: Transport = server.transport()
    marks: list[tuple[str, float]] = []
    _wrap_phases(marks)
    gc_start: list[float] = []

    def on_gc(phase: str, info: dict[str, Any]) -> None:  # note every collection over 5 ms
        if phase == "start":
            gc_start[:] = [time.perf_counter()]
        elif gc_start and (took := time.perf_counter() - gc_start[0]) > 0.005:
            marks.append((f"gc gen{info['generation']} {1000 * took:.0f} ms", asyncio.get_running_loop().time()))

    gc.callbacks.append(on_gc)
    monitor = Monitor()
    loop = asyncio.get_running_loop()
    mon = loop.create_task(monitor.run())
    await asyncio.sleep(0.05)
    informer = Informer(transport, server.resource, namespace="default", list_mode=mode)  # type: ignore[arg-type]
    received = [0]
    informer.subscribe(lambda old, new: received.__setitem__(0, received[0] + 1))
    t0 = loop.time()
    informer.start()
    await informer.synced.wait()
    while received[0] < n:
        await asyncio.sleep(0.01)
    t1 = loop.time()
    report("first sync", n, t0, t1, monitor, marks)
    if relist:
        marks.clear()
        before = informer.lists
        cmd_q.put("relist")
        await loop.run_in_executor(None, port_q.get)
        t0 = loop.time()
        while informer.lists == before or received[0] < 2 * n:
            await asyncio.sleep(0.01)
        t1 = loop.time()
        report("relist (all changed)", n, t0, t1, monitor, marks)
    mon.cancel()
    await informer.stop()
    await transport.close()
    cmd_q.put("stop")


def report(what: str, n: int, t0: float, t1: float, monitor: Monitor, marks: list[tuple[str, float]]) -> None:
    print(f"== {what}: {n} objects in {t1 - t0:.2f} s; load {os.getloadavg()[0]:.2f}")
    for gap, end in monitor.worst(t0):
        print(f"   stall {gap:7.1f} ms ending at +{end - t0:6.3f} s")
    for label, t in marks:
        print(f"   {label:28s} at +{t - t0:6.3f} s")
    print(f"   gc: enabled={gc.isenabled()} frozen={gc.get_freeze_count()} tracked={len(gc.get_objects())}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--mode", choices=("stream", "paged"), default="stream")
    ap.add_argument("--relist", action="store_true")
    args = ap.parse_args()
    ctx = multiprocessing.get_context("spawn")
    port_q, cmd_q = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_serve, args=(args.n, port_q, cmd_q), daemon=True)
    child.start()
    try:
        asyncio.run(measure(args.n, args.mode, args.relist, port_q, cmd_q))
    finally:
        child.join(timeout=10)
        if child.is_alive():
            child.terminate()


if __name__ == "__main__":
    main()
