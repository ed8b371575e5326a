"""What the write fence costs per write (issue 22, "Fenced writes"; goal: ≤ 1 µs).

The transport runs this for every request it is asked to send (declop/kube/transport.py):

    fence = current() if method != "GET" else None      # once per request
    ...                                                 # the rate-limit wait
    if fence is not None:
        fence.check(method, path)                       # before each attempt (one, unless retried)

Measured here, per write, each as the median of ``--repeats`` timings (CPU time of the process)
of ``--number`` iterations:

- ``no fence``: outside a call, or a call without leader election and sharding (one ContextVar read);
- ``leader``: a call under a real :class:`~declop.leases.leader.LeaderElector` holding its Lease
  (``valid()`` reads CLOCK_BOOTTIME);
- ``range``: the same with a range's elector (sharded mode: the same ``valid()``);
- ``enter+leave``: what the controller adds per call (not per write) to set the fence around it;
- ``pool connect``: what the request pool (:class:`~declop.kube.fencing.FencedConnector`) adds
  before it runs, per request — its ``connect`` called and the coroutine dropped unrun — against
  aiohttp's own pool: an unfenced request (a GET, or a write with no fence set) must cost no
  more than one context-variable read.

    python bench/fence_check.py
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import timeit

import aiohttp

from declop.kube import fencing
from declop.kube.fencing import FencedConnector, WriteFence, current
from declop.kube.keys import Request
from declop.leases.leader import LeaderElector

PATH = "/api/v1/namespaces/bench/configmaps/obj-1"


def gate(method: str = "PATCH", path: str = PATH) -> None:
    """The transport's check of one write (one attempt), verbatim."""
    fence = current() if method != "GET" else None
    if fence is not None:
        fence.check(method, path)


def held(name: str) -> LeaderElector:
    e = LeaderElector(None, name=name, namespace="bench", identity="bench", lease_duration=3600, renew_deadline=3000)
    e.is_leader, e.renewed_at = True, e.clock()  # just renewed: valid for the whole run
    return e


def per_call_ns(fn: object, number: int, repeats: int) -> float:
    # CPU time of this process: a machine shared with other jobs deschedules it, which wall time counts
    times = timeit.repeat(fn, number=number, repeat=repeats, timer=time.process_time)  # type: ignore[arg-type]
    return statistics.median(times) / number * 1e9


class _Req:
    """What the pool's ``connect`` reads before it runs: the method (and the path, when fenced)."""

    method = "GET"


def pool_rows(number: int, repeats: int) -> list[tuple[str, float]]:
    """``connect`` of aiohttp's pool and of declop's, per unfenced request (made and closed)."""

    async def measure() -> list[tuple[str, float]]:
        rows = []
        req, timeout = _Req(), aiohttp.ClientTimeout()
        pools = [("aiohttp's TCPConnector", aiohttp.TCPConnector()), ("FencedConnector, unfenced", FencedConnector())]
        for label, pool in pools:
            connect = lambda: pool.connect(req, [], timeout).close()  # type: ignore[arg-type]  # noqa: E731
            rows.append((f"pool connect: {label}", per_call_ns(connect, number, repeats)))
            await pool.close()
        return rows

    return asyncio.run(measure())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--number", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    key = Request("bench", "obj-1")
    rows: list[tuple[str, float]] = []
    rows.append(("empty function call (the floor of the rows)", per_call_ns(lambda: None, args.number, args.repeats)))
    rows.append(("no fence (outside a call / no Lease)", per_call_ns(gate, args.number, args.repeats)))
    for label, elector in (("leader Lease", held("bench-leader")), ("range Lease", held("bench-widgets-shard-0-of-4"))):
        fence = WriteFence(elector.valid, f"bench/{elector.name}", key)
        assert elector.valid()
        token = fencing.enter(fence)
        try:
            rows.append((f"{label}, valid: the check of one write", per_call_ns(gate, args.number, args.repeats)))
        finally:
            fencing.leave(token)
    fence = WriteFence(held("bench-leader").valid, "bench/bench-leader", key)
    rows.append(("enter + leave (per call, not per write)", per_call_ns(lambda: fencing.leave(fencing.enter(fence)), args.number, args.repeats)))
    rows.append(("WriteFence(...) (per call)", per_call_ns(lambda: WriteFence(fence.valid, "bench/bench-leader", key), args.number, args.repeats)))
    rows.extend(pool_rows(args.number, args.repeats))
    print(f"ns per operation, median of {args.repeats} × {args.number:,}")
    for label, ns in rows:
        print(f"  {label:<48} {ns:8.1f}")


if __name__ == "__main__":
    main()
