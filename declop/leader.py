"""Leader election on a ``coordination.k8s.io/v1`` Lease, compatible with client-go's.

Protocol (client-go ``leaderelection``):

1. Every ``retry_period`` (2 s, jittered) a candidate reads the Lease. It takes it when it does not
   exist (create), when it is free (empty ``holderIdentity``), or when the holder has not renewed
   for ``lease_duration`` (15 s) *as observed on our own monotonic clock* — clocks of different
   machines are never compared. Taking and renewing are PUTs with the read resourceVersion, so of
   two racing candidates exactly one wins (the other gets 409).
2. The leader renews every ``retry_period``. If it cannot renew for ``renew_deadline`` (10 s) it has
   lost: :meth:`LeaderElector.run` returns, and the manager stops reconciling at once.
3. On a graceful stop the leader releases the Lease (empty holder, 1 s duration) so a standby
   takes over within one retry period instead of waiting for expiry.

Invariant: ``is_leader`` is True only between a successful acquire and the first failed renewal
past the deadline (or the release). Validated like client-go: duration > deadline > 1.2 × retry.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import random
import socket
import uuid
from typing import Any, Callable

from .clock import MONOTONIC, Clock
from .errors import ApiError, ConfigError, Conflict, NotFound

__all__ = ["LeaderElector"]

log = logging.getLogger("declop.leader")


def _now_micro() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Acquire, hold and release one Lease."""

    def __init__(
        self,
        transport: Any,
        *,
        name: str,
        namespace: str,
        identity: str | None = None,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock: Clock = MONOTONIC,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        if not lease_duration > renew_deadline > retry_period * 1.2:
            raise ConfigError(
                "leader election needs lease_duration > renew_deadline > 1.2 × retry_period, got "
                f"{lease_duration} / {renew_deadline} / {retry_period}"
            )
        self.transport = transport
        self.name, self.namespace = name, namespace
        self.identity = identity or f"{socket.gethostname()}_{uuid.uuid4()}"
        self.lease_duration, self.renew_deadline, self.retry_period = lease_duration, renew_deadline, retry_period
        self.clock = clock
        self.on_change = on_change
        self.is_leader = False
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"

    def _set_leader(self, value: bool) -> None:
        if value != self.is_leader:
            self.is_leader = value
            if self.on_change is not None:
                self.on_change(value)

    def _spec(self, old: dict[str, Any] | None) -> dict[str, Any]:
        now = _now_micro()
        spec = dict(old or {})
        if spec.get("holderIdentity") != self.identity:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if old else 0)
        spec["holderIdentity"] = self.identity
        spec["leaseDurationSeconds"] = int(round(self.lease_duration))
        spec["renewTime"] = now
        return spec

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; True if we hold the Lease afterwards."""
        try:
            lease = await self.transport.request("GET", f"{self._path}/{self.name}", lane="leader")
        except NotFound:
            spec = self._spec(None)
            body: dict[str, Any] = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": spec,
            }
            try:
                await self.transport.request("POST", self._path, body=body, lane="leader")
            except Conflict:
                return False  # someone else created it first
            self._observe(spec)
            return True
        spec = lease.get("spec") or {}
        self._observe(spec)
        holder = spec.get("holderIdentity") or ""
        if holder and holder != self.identity:
            duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
            if self.clock() < self._observed_at + duration:
                return False  # held by someone else and not expired as far as we have seen
        lease["spec"] = self._spec(spec)
        try:
            await self.transport.request("PUT", f"{self._path}/{self.name}", body=lease, lane="leader")
        except Conflict:
            return False
        self._observe(lease["spec"])
        return True

    def _observe(self, spec: dict[str, Any]) -> None:
        record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseDurationSeconds"))
        if record != self._observed:
            self._observed = record
            self._observed_at = self.clock()

    async def acquire(self) -> None:
        """Wait until we are the leader."""
        log.info("Attempting to acquire leader lease", extra={"kv": {"lease": f"{self.namespace}/{self.name}", "identity": self.identity}})
        while True:
            try:
                if await self.try_acquire_or_renew():
                    self._set_leader(True)
                    log.info("Successfully acquired lease", extra={"kv": {"lease": f"{self.namespace}/{self.name}"}})
                    return
            except ApiError as exc:
                log.error("Error retrieving lease", extra={"kv": {"lease": f"{self.namespace}/{self.name}", "error": str(exc)}})
            await asyncio.sleep(self.retry_period * (1 + random.random() * 0.2))

    async def hold(self) -> None:
        """Renew until a renewal has failed for ``renew_deadline``; then return (leadership lost)."""
        last_ok = self.clock()
        while True:
            await asyncio.sleep(self.retry_period)
            try:
                ok = await asyncio.wait_for(self.try_acquire_or_renew(), timeout=self.renew_deadline)
            except (ApiError, asyncio.TimeoutError) as exc:
                log.warning("Failed to renew lease", extra={"kv": {"lease": f"{self.namespace}/{self.name}", "error": str(exc)}})
                ok = False
            if ok:
                last_ok = self.clock()
            elif self.clock() - last_ok >= self.renew_deadline:
                self._set_leader(False)
                log.error("Leader election lost", extra={"kv": {"lease": f"{self.namespace}/{self.name}"}})
                return

    async def release(self) -> None:
        """Give the Lease up (if we hold it) so a standby takes over at once."""
        if not self.is_leader:
            return
        self._set_leader(False)
        try:
            lease = await self.transport.request("GET", f"{self._path}/{self.name}", lane="leader")
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            spec.update({"holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": _now_micro()})
            await self.transport.request("PUT", f"{self._path}/{self.name}", body=lease, lane="leader")
            log.info("Released leader lease", extra={"kv": {"lease": f"{self.namespace}/{self.name}"}})
        except ApiError as exc:
            log.warning("Could not release lease", extra={"kv": {"error": str(exc)}})
