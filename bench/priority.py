"""Priority queue scenarios (issue 16): FIFO vs priority after a restart, and starvation.

``restart`` — against a real kube-apiserver (``declop.testing.ControlPlane``; binaries from
``DECLOP_ASSETS_DIR``): N ConfigMaps exist; declop's Manager starts in this process (its initial
list queues N keys: low priority), and 0.2 s after the start one new ConfigMap is created. Row:
the seconds from that create's answer to its reconcile, how many backlog keys ran before it, and
when the backlog was done — for ``priority=False`` (FIFO) and the default priority queue. The
handler is a plain ``def`` that sleeps ``--handler-ms`` (an API call's worth of work; 0: no-op).

``starvation`` — in-process, no apiserver (it measures the queue policy, not the apiserver): the
controller pipeline (subscriber → queue → worker → thread pool → handler) with a fake informer;
``--low`` keys arrive as an initial list (low priority), then ``--rate`` real changes per second
over ``--hot`` other keys for ``--seconds``, ``max_concurrent=1``, a handler of ``--handler-ms``
— enough to keep the worker busy with normal keys alone. Row per variant (default aging,
``aging=0`` = strict priorities as controller-runtime, FIFO): low keys reconciled during the
window, the longest wait of a low key (list → its reconcile; "starved" when not reconciled),
and the p99 wait of the normal events.

    python bench/priority.py restart --n 2000 --handler-ms 1 --out bench/results/<dir>
    python bench/priority.py starvation --low 1000 --rate 200 --seconds 20 --out bench/results/<dir>
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import concurrent.futures
import csv
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import declop


def write(out: Path | None, name: str, rows: list[dict[str, Any]]) -> None:
    for row in rows:
        print("  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    if out is None or not rows:
        return
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


# -- restart ---------------------------------------------------------------------------------------
def restart(n: int, handler_ms: float, runs: int, out: Path | None) -> None:
    import kubernetes.client

    from declop.manager import Options
    from declop.testing.cluster.controlplane import ControlPlane
    from declop.testing.cluster.runner import OperatorRunner, wait_for

    rows = []
    with ControlPlane(controller_manager=False) as cp, cp.api_client() as api:
        core = kubernetes.client.CoreV1Api(api)
        ns = "bench-restart"
        core.create_namespace({"metadata": {"name": ns}})
        names = [f"obj-{i:05d}" for i in range(n)]
        data = {f"k{i}": "x" * 1000 for i in range(6)}  # ~6 KB, as the other rows
        t = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda name: core.create_namespaced_config_map(ns, {"metadata": {"name": name}, "data": data}), names))
        print(f"created {n} ConfigMaps in {time.monotonic() - t:.1f} s", flush=True)
        for run in range(1, runs + 1):
            for variant in ("fifo", "priority"):
                registry = declop.registry.Registry()
                first: dict[str, float] = {}
                order: list[str] = []
                lock = threading.Lock()

                @declop.reconciler("configmaps", registry=registry, priority=variant == "priority", name="restart")
                def handle(name: str, **_: Any) -> None:
                    with lock:
                        if name not in first:
                            first[name] = time.monotonic()
                            order.append(name)
                    if handler_ms:
                        time.sleep(handler_ms / 1000)

                fresh = f"new-{variant}-{run}"
                acked: list[float] = []

                def create_fresh(name: str = fresh) -> None:
                    core.create_namespaced_config_map(ns, {"metadata": {"name": name}, "data": {"k": "v"}})
                    acked.append(time.monotonic())

                runner = OperatorRunner(registry, kubeconfig=cp.kubeconfig_path, options=Options(namespaces=(ns,), grace_period=1), ready_timeout=120)
                t_start = time.monotonic()
                timer = threading.Timer(0.2, create_fresh)
                timer.start()
                with runner:
                    wait_for(lambda: fresh in first, 600, what="the new object's reconcile")
                    wait_for(lambda: len(first) >= n + 1, 600, interval=0.1, what="the backlog")
                    t_done = max(first.values())
                timer.join()
                before = order.index(fresh)
                rows.append({
                    "scenario": "restart", "run": run, "n": n, "handler_ms": handler_ms, "queue": variant,
                    "new_object_reconciled_after_s": first[fresh] - acked[0],
                    "backlog_keys_before_it": before,
                    "backlog_done_after_start_s": t_done - t_start,
                })
                print(rows[-1], flush=True)
                core.delete_namespaced_config_map(fresh, ns)
    write(out, "priority_restart", rows)


# -- starvation ------------------------------------------------------------------------------------
class _Ctx:
    transport = None
    recorder = None


def starvation(low: int, hot: int, rate: float, seconds: float, handler_ms: float, out: Path | None) -> None:
    rows = []
    for variant, priority in (("priority (aging 10/s)", True), ("strict (aging 0)", declop.queue.priority.Priority(aging=0)), ("fifo", False)):
        rows.append(asyncio.run(_starve(variant, priority, low, hot, rate, seconds, handler_ms)))
        print(rows[-1], flush=True)
    write(out, "priority_starvation", rows)


async def _starve(variant: str, priority: Any, low: int, hot: int, rate: float, seconds: float, handler_ms: float) -> dict[str, Any]:
    from declop.cache.store import Store, Writer
    from declop.reconcile.controller import Controller, Source
    from declop.kube.discovery import ResourceInfo
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

    starts: dict[str, list[float]] = {}

    def handle(name: str, **_: Any) -> None:
        starts.setdefault(name, []).append(time.monotonic())
        time.sleep(handler_ms / 1000)

    registry = declop.registry.Registry()
    registry.reconciler("configmaps", priority=priority)(handle)
    informer = Informer()
    pool = concurrent.futures.ThreadPoolExecutor(2)
    c = Controller(registry.registrations[0], cm, [Source((informer,), enqueue_self, primary=True)], _Ctx(), executor=pool)  # type: ignore[arg-type]
    on_event = c.subscriber(c.sources[0])
    worker = asyncio.ensure_future(c._worker())

    def obj(name: str, rv: int) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "b", "resourceVersion": str(rv), "labels": {"v": str(rv)}}, "data": {"k": "v"}}

    for i in range(hot):
        informer.writer.upsert(obj(f"hot-{i}", 1))
    t_list = time.monotonic()
    informer.syncing = True
    for i in range(low):
        old, new = informer.writer.upsert(obj(f"low-{i}", 1))
        on_event(old, new)
    informer.syncing = False
    arrivals: list[tuple[str, float]] = []
    total = int(rate * seconds)
    t0 = time.monotonic()
    for i in range(total):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        name = f"hot-{i % hot}"
        old, new = informer.writer.upsert(obj(name, 2 + i))
        on_event(old, new)
        arrivals.append((name, time.monotonic()))
    t_end = time.monotonic()
    c.queue.shutdown()
    await asyncio.wait_for(worker, 60)
    pool.shutdown()
    low_starts = [starts[f"low-{i}"][0] for i in range(low) if f"low-{i}" in starts]
    within = sum(1 for t in low_starts if t <= t_end)
    waits = []
    for name, t in arrivals:
        s = starts.get(name, [])
        j = bisect.bisect_left(s, t)
        if j < len(s):
            waits.append(s[j] - t)
    waits.sort()
    return {
        "scenario": "starvation", "queue": variant, "low_keys": low, "normal_rate": rate, "window_s": seconds,
        "handler_ms": handler_ms,
        "low_reconciled_in_window": within,
        "low_max_wait_s": (max(low_starts) - t_list) if within == low else float("inf"),
        "normal_p50_wait_s": statistics.median(waits) if waits else float("nan"),
        "normal_p99_wait_s": waits[int(len(waits) * 0.99) - 1] if waits else float("nan"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="scenario", required=True)
    r = sub.add_parser("restart")
    r.add_argument("--n", type=int, default=2000)
    r.add_argument("--handler-ms", type=float, default=1.0)
    r.add_argument("--runs", type=int, default=1)
    r.add_argument("--out", type=Path)
    s = sub.add_parser("starvation")
    s.add_argument("--low", type=int, default=1000)
    s.add_argument("--hot", type=int, default=200)
    s.add_argument("--rate", type=float, default=200.0)
    s.add_argument("--seconds", type=float, default=60.0)
    s.add_argument("--handler-ms", type=float, default=5.0)
    s.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.scenario == "restart":
        restart(args.n, args.handler_ms, args.runs, args.out)
    else:
        starvation(args.low, args.hot, args.rate, args.seconds, args.handler_ms, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
