"""A fenced write that waits in the transport's connection pool is refused when it gets its
connection if its Lease was lost meanwhile (issue 42, hazard 5): the real Transport over TLS to a
real apiserver, a real LeaderElector's ``valid()`` as the fence.

The pool has one connection, held by a watch (``timeoutSeconds``) for longer than the Lease's renew
deadline; nothing renews the Lease, so its fence closes on its own clock while the write waits.
The write passed its first check (the Lease was valid then), must raise ``Fenced`` at the second,
and the apiserver must never see it. (tests/unit/kube/test_fencing.py covers the same against an
aiohttp server, with the fence closed by hand: plain handlers' threads and aiohttp's resend too.)
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from declop.errors import Fenced, NotFound
from declop.kube import fencing
from declop.kube.fencing import WriteFence
from declop.kube.keys import Request
from declop.kube.transport import Transport, load_configuration
from declop.leases.leader import LeaderElector
from declop.testing.cluster.controlplane import ControlPlane

pytestmark = pytest.mark.integration

#: the Lease's renew deadline, and how long the watch holds the only connection (longer)
RENEW_DEADLINE, HANG = 1.5, 3


def test_a_write_waiting_for_the_pool_is_refused_once_its_lease_expired(
    control_plane: ControlPlane, namespace: str
) -> None:
    configmaps = f"/api/v1/namespaces/{namespace}/configmaps"
    answers: list[bool] = []

    async def run() -> Any:
        transport = Transport(load_configuration(control_plane.kubeconfig_path), max_connections=1)
        try:
            await transport.request("GET", configmaps)  # the pool's one connection, kept alive
            elector = LeaderElector(
                transport,
                name="pool-fence",
                namespace=namespace,
                identity="a",
                lease_duration=2.0,
                renew_deadline=RENEW_DEADLINE,
                retry_period=0.5,
                exclusive=False,  # a Lease we create opens at once
            )
            await elector.acquire()  # and never renewed: the fence closes RENEW_DEADLINE later

            def valid() -> bool:
                answers.append(elector.valid())
                return answers[-1]

            fence = WriteFence(valid, f"{namespace}/pool-fence", Request(namespace, "late"))
            pods = f"/api/v1/namespaces/{namespace}/pods"
            # no pods: the watch sends nothing and ends after HANG s with an empty body
            watch = {"watch": "1", "timeoutSeconds": str(HANG)}
            hanging = asyncio.ensure_future(
                transport.request("GET", pods, params=watch, timeout=HANG + 30, lane="informer")
            )
            token = fencing.enter(fence)  # as the controller does around a call
            try:
                body = {"metadata": {"name": "late"}, "data": {"written": "after the Lease"}}
                write = asyncio.ensure_future(transport.request("POST", configmaps, body=body))
            finally:
                fencing.leave(token)
            assert await hanging is None
            with pytest.raises(Fenced, match=f"POST {configmaps} was not sent"):
                await write
            assert fence.tripped is not None
            with pytest.raises(NotFound):
                await transport.request("GET", f"{configmaps}/late")  # and the connection is back
            return transport.statistics().by_verb
        finally:
            await transport.close()

    by_verb = asyncio.run(asyncio.wait_for(run(), 60))
    assert answers == [True, False], "valid at its first check, lost when it had its connection"
    assert by_verb.get("create", 0) == 1, "the Lease's creation; the refused write is not counted"
