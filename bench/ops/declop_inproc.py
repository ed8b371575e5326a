"""declop in-process probes: the same no-op handler as declop_noop.py, run by declop's Manager
with default Options, plus two probes that need to live inside the process:

* event-loop stall (scenario g): an asyncio task ticks every 10 ms and logs each new maximum
  lateness to ``$BENCH_STALL_OUT``;
* in-process event→reconcile latency (scenario b): ``declop.cache.watch.loads`` (the function the
  watch loop calls on every received line) is wrapped to note ``time.time_ns()``, the key and the
  bench/seq of each watch event; the list goes to ``$BENCH_RECV_OUT`` at exit. The harness pairs
  each received event with the first reconcile of that key that read a seq at least as new.
* ``$BENCH_SYNTH=rate:seconds[,rate:seconds…]`` (optional): the initial sync (streaming list or
  LIST; ``$DECLOP_LIST_MODE`` as for ``declop run``) comes from the real apiserver, but the watch
  stream (after the streaming list's initial-events-end bookmark) is replaced by a synthetic one, generated in this process, that
  sends MODIFIED events of the listed objects (round-robin, ``bench/seq`` = phase×10,000,000 + i)
  at each rate for that many seconds, after a 2 s pause, with 1 s between phases. This isolates
  declop's own pipeline (decode → cache → queue → worker → handler) from apiserver load on a
  2-core machine where the apiserver, etcd and the generator compete for the same cores. Lines
  are serialized with orjson on the loop, as a socket read would cost. Real transport otherwise.

declop itself is not modified. Usage:
    python bench/ops/declop_inproc.py <namespace> <kubeconfig>
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import orjson  # noqa: E402

import declop  # noqa: E402
import declop.cache.watch  # noqa: E402
import declop.manager.process  # noqa: E402
from declop.logs import configure  # noqa: E402
from declop.manager import Manager, Options  # noqa: E402
from declop.registry import default_registry  # noqa: E402
from declop.kube.transport import load_configuration  # noqa: E402
from declop.version import __version__  # noqa: E402

from common import stall_probe  # noqa: E402

import declop_noop  # noqa: E402,F401  (registers the handler in the default registry)

_received: list[tuple[int, str, str]] = []
_loads = declop.cache.watch.loads


def _timed_loads(line: bytes):
    t = time.time_ns()
    event = _loads(line)
    obj = event.get("object") or {}
    meta = obj.get("metadata") or {}
    if event.get("type") in ("ADDED", "MODIFIED"):
        seq = (meta.get("annotations") or {}).get("bench/seq") or "-"
        _received.append((t, f"{meta.get('namespace', '')}/{meta.get('name', '')}", seq))
    return event


class SyntheticWatchTransport(declop.manager.process.Transport):  # type: ignore[misc,name-defined]
    """The real Transport, except that watches of the benchmark resource are synthetic."""

    phases: list[tuple[float, float]] = []

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self._templates: list[dict] = []

    async def request(self, method, path, **kw):
        result = await super().request(method, path, **kw)
        if method == "GET" and isinstance(result, dict) and "items" in result and path.endswith(
            "/" + os.environ.get("BENCH_PLURAL", "configmaps")
        ):
            # copy before declop's informer adds kind/apiVersion and strips managedFields in place
            self._templates.extend(orjson.loads(orjson.dumps(result["items"])))
        return result

    async def stream(self, path, params, **kw):
        plural = "/" + os.environ.get("BENCH_PLURAL", "configmaps")
        if params.get("sendInitialEvents") == "true" and path.endswith(plural) and not self._templates:
            # a streaming list: pass its initial events through (keeping copies as templates) up
            # to the initial-events-end bookmark, then the same stream turns synthetic
            rv = None
            real = super().stream(path, params, **kw)
            try:
                async for line in real:
                    event = orjson.loads(line)
                    obj = event.get("object") or {}
                    if event.get("type") == "ADDED":
                        self._templates.append(obj)
                    yield line
                    meta = obj.get("metadata") or {}
                    if event.get("type") == "BOOKMARK" and (meta.get("annotations") or {}).get(
                        "k8s.io/initial-events-end"
                    ) == "true":
                        rv = int(meta["resourceVersion"])
                        break
            finally:
                await real.aclose()
            if rv is not None:
                async for line in self._synthetic(rv):
                    yield line
            return
        if not self._templates:
            async for line in super().stream(path, params, **kw):
                yield line
            return
        async for line in self._synthetic(int(params.get("resourceVersion") or 1)):
            yield line

    async def _synthetic(self, rv):
        templates = self._templates
        await asyncio.sleep(2.0)
        for phase, (rate, seconds) in enumerate(self.phases, start=1):
            start = time.monotonic()
            total = int(rate * seconds)
            for i in range(total):
                due = start + i / rate
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                obj = templates[i % len(templates)]
                meta = obj["metadata"]
                rv += 1
                meta["resourceVersion"] = str(rv)
                meta.setdefault("annotations", {})["bench/seq"] = str(phase * 10_000_000 + i)
                yield orjson.dumps({"type": "MODIFIED", "object": obj})
            await asyncio.sleep(1.0)
        await asyncio.sleep(3600)  # never re-watch with a made-up resourceVersion


async def main(namespace: str, kubeconfig: str) -> None:
    configure("plain", 20)
    declop.cache.watch.loads = _timed_loads
    synth = os.environ.get("BENCH_SYNTH")
    if synth:
        SyntheticWatchTransport.phases = [tuple(map(float, p.split(":"))) for p in synth.split(",")]
        declop.manager.process.Transport = SyntheticWatchTransport
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    probe = None
    if os.environ.get("BENCH_STALL_OUT"):
        probe = loop.create_task(stall_probe(os.environ["BENCH_STALL_OUT"]))
    options = Options(namespaces=(namespace,), user_agent=f"declop/{__version__}",
                      list_mode=os.environ.get("DECLOP_LIST_MODE", "auto"))
    manager = Manager(load_configuration(kubeconfig), default_registry, options)
    try:
        await manager.run(stop)
    finally:
        if probe:
            probe.cancel()
        out = os.environ.get("BENCH_RECV_OUT")
        if out:
            with open(out, "w") as f:
                f.writelines(f"{t} {k} {s}\n" for t, k, s in _received)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
