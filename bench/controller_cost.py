"""The controller's own cost per key, without an apiserver: a fake informer holding 2,000 6 KB
ConfigMaps, an inline executor (no thread hop, so only declop's Python is measured), a no-op plain
handler with the defaults (``max_concurrent=1``). "one at a time": each key is added once the
previous one was reconciled; "backlog": 2,000 keys queued at once (batches of 64). Min of 7
repetitions, CPU µs per key.

    PYTHONPATH=<tree> python bench/controller_cost.py    # <tree>: a checkout whose declop/ to measure
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import time
from typing import Any

import declop
from declop.cache.store import Store, Writer
from declop.reconcile.controller import Controller, Source
from declop.kube.discovery import ResourceInfo
from declop.kube.keys import Request
from declop.reconcile.mapping import enqueue_self

CM = ResourceInfo(group="", version="v1", plural="configmaps", kind="ConfigMap", namespaced=True)
KEYS = 2000


class Inline(concurrent.futures.Executor):
    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        future.set_result(fn(*args, **kwargs))
        return future


class FakeInformer:
    def __init__(self) -> None:
        self.store = Store("configmaps")
        self.writer = Writer(self.store)
        self.namespace, self.name, self.last_error = "", "configmaps", ""
        self.synced = asyncio.Event()

    def subscribe(self, handler: Any) -> None:
        pass


class Ctx:
    transport = None
    recorder = None


calls = 0


def noop(request: Any, obj: Any, **_: Any) -> None:
    global calls
    calls += 1


async def main() -> None:
    registry = declop.registry.Registry()
    registry.reconciler("configmaps")(noop)
    informer = FakeInformer()
    data = {f"k{i}": os.urandom(500).hex() for i in range(6)}
    for i in range(KEYS):
        informer.writer.upsert({"metadata": {"name": f"obj-{i}", "namespace": "b", "resourceVersion": "1"}, "data": dict(data)})
    c = Controller(registry.registrations[0], CM, [Source((informer,), enqueue_self, primary=True)], Ctx(), executor=Inline())  # type: ignore[arg-type]
    worker = asyncio.ensure_future(c._worker())
    one, backlog = [], []
    for _ in range(7):
        start, cpu = calls, time.process_time()
        for i in range(KEYS):
            c.queue.add(Request("b", f"obj-{i}"))
            while calls < start + i + 1:
                await asyncio.sleep(0)
        one.append((time.process_time() - cpu) / KEYS * 1e6)
        start, cpu = calls, time.process_time()
        for i in range(KEYS):
            c.queue.add(Request("b", f"obj-{i}"))
        while calls < start + KEYS:
            await asyncio.sleep(0)
        backlog.append((time.process_time() - cpu) / KEYS * 1e6)
    c.queue.shutdown()
    await worker
    print(f"one at a time {min(one):.1f} µs/key   backlog {min(backlog):.2f} µs/key")


if __name__ == "__main__":
    asyncio.run(main())
