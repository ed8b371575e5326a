"""The stop order of one manager.

1. Intake stops: the start runnables are cancelled; sharded, no new range is taken.
2. Drain: controllers finish in-flight reconciles and background tasks are told to stop, within
   the grace period — **while the Lease keeps being renewed**.
3. Shutdown hooks, while the Lease is held and the client works.
4. The Leases: leader election stops renewing, and the Lease is released — unless a call under
   it still runs (:meth:`Manager.running`): then it is left to expire, which is a loss; then the
   background Lease, then the range Leases (a range busy under a running call: a loss too).
5. Webhook server and certificate renewal (served through the drain: another replica may not be
   up yet), informers, the transport, the handler threads, the loop-lag probe, and the probes
   last: ``/healthz`` answers until the process goes.

After a loss (before or during the stop) there is no drain and every step shares the loss's
budget (:mod:`declop.manager.loss`); otherwise each step is bounded on its own.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Coroutine

from declop.manager.leadership import BACKGROUND, LEADER_ONLY_BACKGROUND, BackgroundLease, LeaderLease, RangeLeases, Resharding
from declop.manager.preflight import REVIEW

__all__ = ["shutdown"]

log = logging.getLogger("declop.manager")

#: seconds a stop step that waits for nothing of the user's may take (servers, informers, transport)
STEP_SECONDS = 30.0


async def _stop_runnable(m: Any, name: str, what: str) -> None:
    task = m.group.pop(name)
    if task is not None:
        await m.loss.bounded(asyncio.gather(task, return_exceptions=True), 1.0, what)


async def shutdown(m: Any) -> bool:
    """Stop ``m`` in the order above; True when every controller drained in time."""
    loss, o = m.loss, m.options
    m.stopping = True
    m.group.cancel([*m.group.names("start "), REVIEW, BACKGROUND, LEADER_ONLY_BACKGROUND])
    if m.shard_leases is not None:
        m.shard_leases.stopping = True  # renew only: take no range while draining
    grace = 0.0 if loss.happened else o.grace_period
    stopping: list[Coroutine[Any, Any, Any]] = [c.stop(grace) for c in m.controllers]
    if m.lifecycle is not None:
        stopping.append(m.lifecycle.stop_background(grace=grace, settle=min(0.5, loss.left()) if loss.happened else 1.0))
    results = await loss.bounded(asyncio.gather(*stopping), grace + 2.0, "draining")
    clean = results is not None and all(r is not False for r in results[: len(m.controllers)])
    if results is not None and m.lifecycle is not None:
        m.left_running += len(results[-1])
    lost = loss.happened  # also when the Lease was lost during the drain
    if not clean and not lost:
        log.warning("Grace period over; some reconciles did not finish", extra={"kv": {"gracePeriod": o.grace_period}})
    if m.lifecycle is not None and m.started_up:
        ok = await loss.bounded(m.lifecycle.shutdown(), 1.0 if lost else o.grace_period, "running the shutdown hooks")
        if ok is None:
            m.left_running += 1  # a hook still runs (in its thread): the Lease stays
        if ok is not True:
            m.exit_code = 1
    await _stop_runnable(m, LeaderLease.name, "stopping leader election")  # renewing stops only now
    if m.elector is not None:
        m.elector.running = m.running
        if not loss.happened and m.running() and m.elector.is_leader:
            # left to expire under a running call: a loss — gone within the exit bound, before a
            # standby may take it (lease duration - renew deadline after our last renewal)
            m.lose()
        await loss.bounded(m.elector.release(), o.renew_deadline, "releasing the Lease")
    await _stop_runnable(m, BackgroundLease.name, "stopping the background lease")  # renewed while its tasks stopped
    if m.background_elector is not None and not lost:
        m.background_elector.running = lambda: m.left_running
        await loss.bounded(m.background_elector.release(), o.renew_deadline, "releasing the background Lease")
    m.group.cancel([Resharding.name])
    await _stop_runnable(m, RangeLeases.name, "stopping the shard leases")  # renewed through the drain
    if m.shard_leases is not None and not loss.happened:
        if m.shard_leases.busy():
            # ranges left to expire under running calls: a loss; release_all closes their fences
            # first, then releases the idle ranges within what is left of the budget
            m.lose()
        await loss.bounded(m.shard_leases.release_all(), o.renew_deadline, "releasing the shard Leases")
    if m.webhooks is not None:
        await loss.bounded(m.webhooks.stop(), STEP_SECONDS, "stopping the webhook server")
    if m.webhook_cert is not None:
        await loss.bounded(m.webhook_cert.stop(), STEP_SECONDS, "stopping certificate renewal")
    if m.webhook_endpoint is not None:
        m.webhook_endpoint.close()
    if m.informers is not None:
        await loss.bounded(m.informers.stop(), STEP_SECONDS, "stopping the informers")
    if m.transport is not None:
        await loss.bounded(m.transport.close(), STEP_SECONDS, "closing the connections")
    if m.executor is not None:
        m.executor.shutdown(wait=False, cancel_futures=True)
    if m.loop_lag is not None:
        await loss.bounded(m.loop_lag.stop(), 1.0, "stopping the loop lag probe")
    if m.probes is not None:  # last: /healthz answers until the process goes
        await loss.bounded(m.probes.stop(), STEP_SECONDS, "stopping the probe server")
    return clean
