"""Leader election on a ``coordination.k8s.io/v1`` Lease, compatible with client-go's — plus fencing.

The protocol is client-go's (``tools/leaderelection``); docs/leases.md argues each rule:

- a candidate takes the Lease when it is free, or unchanged for ``leaseDurationSeconds`` *as
  observed on our own monotonic clock* (clocks of different machines are never compared); takes
  and renewals are PUTs with the read resourceVersion, so of two racing candidates one wins;
- the leader renews every ``retry_period``; a renew round ends, lost, no later than
  ``renewed_at + renew_deadline`` (the last success), and each request is bounded by
  ``renew_deadline / 2``;
- a missing Lease is created only a lease duration after it was first found missing, and its
  creator leads only once the record has stood for ``renew_deadline`` (:attr:`LeaderElector.opening`
  until then); a Lease nobody else takes (``exclusive=False``, a member Lease) at once;
- a graceful stop releases the Lease, unless a call under it still runs: then it is left to expire.

The fence: :meth:`LeaderElector.valid` is True only while we hold the Lease and ``clock() <
renewed_at + renew_deadline``, ``renewed_at`` taken before the last successful request was sent;
the clock is :data:`declop.clock.LEASE_CLOCK` (it counts suspended time; wall-clock steps do not
move it).

Invariants:

- ``is_leader`` is True only between a successful acquire and the loss or the release;
- the Lease is never released while ``running()`` counts a call under it (I6);
- ``valid()`` implies ``is_leader``, and turns False by itself when the clock passes
  ``renewed_at + renew_deadline`` — no renewal attempt needs to fail first;
- ``valid()`` is False while ``opening``: a Lease we created opens only after a renewal started
  ``renew_deadline`` after the creation succeeded (the record stood that long);
- Lease traffic uses the transport's ``"leader"`` lane: it never waits behind handler writes or
  informer lists, neither for a rate-limit token nor for a pooled connection (its own pool);
- validated like client-go: ``lease_duration > renew_deadline > 1.2 × retry_period`` (> 0).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import math
import random
import socket
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from declop.clock import LEASE_CLOCK, WALL_CLOCK, Clock
from declop.errors import ApiError, ConfigError, Conflict, NotFound

__all__ = ["LEASE_TIMINGS", "LeaderElector", "LeaseTimings"]

log = logging.getLogger("declop.leader")

#: the transport verb named in error lines, per HTTP method
_VERBS = {"GET": "get", "POST": "create", "PUT": "update"}


@dataclass(frozen=True)
class LeaseTimings:
    """How long a Lease lasts and how its holder renews it, in seconds; the defaults are
    client-go's, and every other default of these three (manager options, CLI flags, the
    simulators) is read from :data:`LEASE_TIMINGS`."""

    #: a standby waits this long, on its own clock, before it takes a Lease nobody renewed
    lease_duration: float = 15.0
    #: the holder keeps trying to renew this long after its last renewal before it gives up
    renew_deadline: float = 10.0
    #: between two Lease attempts (acquire or renew)
    retry_period: float = 2.0

    def valid(self) -> bool:
        """client-go's rule: duration > deadline > 1.2 × retry > 0."""
        return self.lease_duration > self.renew_deadline > self.retry_period * 1.2 and self.retry_period > 0

    def check(self, what: str) -> None:
        """Raise :class:`~declop.errors.ConfigError` naming ``what`` unless :meth:`valid`."""
        if not self.valid():
            raise ConfigError(
                f"{what} needs lease_duration > renew_deadline > 1.2 × retry_period > 0, got "
                f"{self.lease_duration} / {self.renew_deadline} / {self.retry_period}"
            )


#: the default timings
LEASE_TIMINGS = LeaseTimings()


def _now_micro(wall_clock: Clock = WALL_CLOCK) -> str:
    """RFC 3339 with microseconds, UTC (a MicroTime): what strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    prints, at two thirds of its cost (every Lease write of every replica formats one)."""
    return datetime.datetime.fromtimestamp(wall_clock(), datetime.timezone.utc).isoformat(timespec="microseconds")[:-6] + "Z"


class LeaderElector:
    """Acquire, hold (renew) and release one Lease; :meth:`valid` is the fence for workers."""

    def __init__(
        self,
        transport: Any,
        *,
        name: str,
        namespace: str,
        identity: str | None = None,
        lease_duration: float = LEASE_TIMINGS.lease_duration,
        renew_deadline: float = LEASE_TIMINGS.renew_deadline,
        retry_period: float = LEASE_TIMINGS.retry_period,
        clock: Clock = LEASE_CLOCK,
        on_change: Callable[[bool], None] | None = None,
        wall_clock: Clock = WALL_CLOCK,
        exclusive: bool = True,
    ) -> None:
        LeaseTimings(lease_duration, renew_deadline, retry_period).check("leader election")
        self.transport = transport
        self.name, self.namespace = name, namespace
        self.identity = identity or f"{socket.gethostname()}_{uuid.uuid4()}"
        self.lease_duration, self.renew_deadline, self.retry_period = lease_duration, renew_deadline, retry_period
        #: seconds each Lease request may take at most (controller-runtime: RenewDeadline / 2)
        self.request_timeout = renew_deadline / 2
        self.clock = clock
        #: writes renewTime/acquireTime (for humans and client-go; nothing decides from them)
        self.wall_clock = wall_clock
        self.on_change = on_change
        #: level of the "Released leader lease" line (range Leases log their own line instead)
        self.release_level = logging.INFO
        self.is_leader = False
        #: clock() when the last successful acquire/renew attempt started; None before the first
        self.renewed_at: float | None = None
        #: why the last Lease attempt failed with 401/403 (it will not heal by retrying), else ""
        self.problem = ""
        #: the holder in the last record we read or wrote
        self.holder = ""
        self._expired = False  # valid() saw the renew deadline pass while we were leading
        self._lease: dict[str, Any] | None = None  # the Lease as we last wrote it (fast-path renew)
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._gone_at: float | None = None  # clock() when we first found the Lease deleted
        self._gone_last = 0.0  # clock() when the last read that found it missing was sent
        #: the fence stays shut until a renewal started at or after this (set by our creation)
        self._opens_at = -math.inf
        self._seen = False  # we know the Lease existed (read it, wrote it, or lost its creation)
        #: False for a Lease nobody else ever takes (a replica's member Lease): when deleted, it is
        #: created again at once, since no other holder's fence can be open
        self.exclusive = exclusive
        #: calls under this Lease still running (the manager's count); :meth:`release` leaves the
        #: Lease to expire instead of releasing it while it is not 0
        self.running: Callable[[], int] | None = None
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self._what = f'leases.coordination.k8s.io "{name}" in namespace "{namespace}"'

    # -- the fence ------------------------------------------------------------------------------
    def valid(self) -> bool:
        """True while we hold the Lease, its last successful renewal is less than
        ``renew_deadline`` old on our monotonic clock, and — if we created it — that renewal
        started at least ``renew_deadline`` after the creation (:meth:`opening`). Cheap; safe to
        call from any thread.

        Once the deadline has passed while leading, it stays False: :meth:`hold` then reports the
        loss even if a renewal in flight succeeds late, so a fence that closed never reopens."""
        at = self.renewed_at
        if not self.is_leader or self._expired or at is None or at < self._opens_at:
            return False
        if self.clock() < at + self.renew_deadline:
            return True
        self._expired = True
        return False

    def live(self) -> bool:
        """:meth:`valid` without the wait after a creation: do we still hold the Lease (a loss
        is reported when this turns False)?"""
        at = self.renewed_at
        if not self.is_leader or self._expired or at is None:
            return False
        if self.clock() < at + self.renew_deadline:
            return True
        self._expired = True
        return False

    @property
    def opening(self) -> bool:
        """True while we hold a Lease we created and its fence has not opened yet."""
        at = self.renewed_at
        return at is not None and at < self._opens_at

    def won(self) -> None:
        """Record that :meth:`try_acquire_or_renew` made us the holder (for callers that drive
        the attempts themselves instead of :meth:`acquire`)."""
        self._set_leader(True)

    def _set_leader(self, value: bool) -> None:
        if value:
            self._expired = False
        if value != self.is_leader:
            self.is_leader = value
            if self.on_change is not None:
                self.on_change(value)

    # -- one attempt ----------------------------------------------------------------------------
    def _spec(self, old: dict[str, Any] | None) -> dict[str, Any]:
        now = _now_micro(self.wall_clock)
        spec = dict(old or {})
        if spec.get("holderIdentity") != self.identity:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if old else 0)
        spec["holderIdentity"] = self.identity
        # rounded up: a standby must never wait less than our lease_duration
        spec["leaseDurationSeconds"] = max(1, math.ceil(self.lease_duration))
        spec["renewTime"] = now
        return spec

    async def _request(self, method: str, path: str, body: Any = None, deadline: float | None = None) -> Any:
        """One Lease request, bounded by ``request_timeout`` and by ``deadline`` (clock time)."""
        timeout = self.request_timeout
        if deadline is not None:
            timeout = min(timeout, deadline - self.clock())
        verb = _VERBS.get(method, method.lower())
        if timeout <= 0:
            raise ApiError(0, "Timeout", f"no time left to {verb} {self._what} before the renew deadline")
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns an answer that lands
            # in the turn its task is cancelled and drops the cancellation (CPython gh-86296), so
            # a stop's cancel of the renewal loop could be lost and the loop renew on
            async with asyncio.timeout(timeout):
                return await self.transport.request(method, path, body=body, timeout=timeout, lane="leader")
        except TimeoutError:
            raise ApiError(0, "Timeout", f"cannot {verb} {self._what}: no answer within {timeout:.3g} s") from None
        except ApiError as exc:
            if isinstance(exc, NotFound if method == "GET" else Conflict):
                raise  # an answer the protocol expects: the Lease does not exist / changed meanwhile
            hint = ""
            if exc.status in (401, 403):
                hint = (
                    "; allow get, create and update on leases (group coordination.k8s.io) in namespace "
                    f'"{self.namespace}" to this identity (the chart\'s leader-election Role does)'
                )
            raise ApiError(exc.status, exc.reason, f"cannot {verb} {self._what}: {exc}{hint}", exc.body) from exc

    async def try_acquire_or_renew(self, deadline: float | None = None) -> bool:
        """One attempt; True if we hold the Lease afterwards (and ``renewed_at`` moved).

        ``deadline`` (clock time) bounds every request of the attempt. Raises
        :class:`~declop.errors.ApiError` (one line naming the verb and the Lease) when a request
        fails or times out.
        """
        started = self.clock()
        try:
            ok = await self._attempt(deadline)
        except ApiError as exc:
            if exc.status in (401, 403):
                self.problem = str(exc)
            if not self.is_leader:
                self._gone_at = None  # no answer: whether the Lease is still missing is unknown
            raise
        self.problem = ""
        if ok:
            self.renewed_at = started
        return ok

    async def _attempt(self, deadline: float | None) -> bool:
        if self.is_leader and self._lease is not None:
            # fast path (client-go): we wrote the last record, so update it optimistically
            lease = self._lease
            lease["spec"] = self._spec(lease.get("spec"))
            sent = self.clock()
            try:
                self._wrote(await self._request("PUT", f"{self._path}/{self.name}", lease, deadline), lease)
                return True
            except ApiError as exc:
                if exc.status not in (404, 409):
                    raise
                self._lease = None  # someone else wrote (or deleted) it: read it first
                if exc.status == 404 and self.exclusive:
                    return self._gone(sent)
        sent = self.clock()
        try:
            lease = await self._request("GET", f"{self._path}/{self.name}", deadline=deadline)
        except NotFound:
            if self.exclusive:
                # if it existed and someone deleted it, whoever held it may still be inside its
                # fence, which stays open until its next renewal finds it gone — and we cannot
                # tell (we may have started after the deletion): create it only once a lease
                # duration has passed since we first saw it missing
                self._gone(sent)
                assert self._gone_at is not None
                if self.clock() < self._gone_at + self.lease_duration:
                    return False
            body: dict[str, Any] = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(None),
            }
            try:
                self._wrote(await self._request("POST", self._path, body, deadline), body)
            except Conflict:
                self._seen, self._gone_at = True, None  # it exists again: a later 404 starts a new wait
                return False  # someone else created it first
            if self.exclusive:
                # a waiting candidate may have missed our record (created and deleted again
                # between two of its reads, which are at most renew_deadline apart, else its wait
                # starts over) and create it while we lead: our fence opens only once a renewal
                # started renew_deadline after this answer succeeded — the record then stood for
                # longer than any such gap, and every waiter saw it
                self._opens_at = self.clock() + self.renew_deadline
            return True
        spec = lease.get("spec") or {}
        self._observe(spec)
        if self.holder and self.holder != self.identity:
            duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
            if self.clock() < self._observed_at + duration:
                return False  # held by someone else and not expired as far as we have seen
        lease["spec"] = self._spec(spec)
        try:
            self._wrote(await self._request("PUT", f"{self._path}/{self.name}", lease, deadline), lease)
        except Conflict:
            return False
        return True

    @property
    def gone(self) -> bool:
        """True since a request found the Lease deleted, until a record of it is seen again."""
        return self._gone_at is not None

    def _gone(self, sent: float) -> bool:
        """The Lease was deleted (404 to a read sent at ``sent``): a leader's fence closes now,
        for good (its :meth:`hold` reports the loss); and the time we first saw it gone is
        noted. Returns False."""
        if self.is_leader:
            self._expired = True
        now = self.clock()
        if self._gone_at is None or now - self._gone_last > self.renew_deadline:
            # a new wait: after a gap without answers (a partition, a pause) the Lease may have
            # been created and deleted again meanwhile, by a holder whose fence is still open.
            # The gap runs from the send of the last read that found it missing to this answer:
            # it covers every instant the apiserver could have answered either read
            self._gone_at = now
        self._gone_last = sent
        return False

    def _wrote(self, answer: Any, sent: dict[str, Any]) -> None:
        lease = answer if isinstance(answer, dict) and answer.get("metadata") else sent
        self._lease = lease
        self._observe(lease.get("spec") or {})

    def observe(self, spec: dict[str, Any]) -> None:
        """Note a record of this Lease read elsewhere (e.g. a LIST of every Lease): its
        ``leaseDurationSeconds`` counts from the first time we saw that very record, whoever read it."""
        if not self.is_leader:
            self._observe(spec)

    def missing(self, sent: float) -> None:
        """Note that a read elsewhere (a LIST of every Lease, sent at ``sent``) found this Lease
        missing: the wait before creating it counts from then, as after a 404 (a leader learns
        it from its renewal)."""
        if not self.is_leader:
            self._gone(sent)

    def _observe(self, spec: dict[str, Any]) -> None:
        self._gone_at, self._seen = None, True
        self.holder = spec.get("holderIdentity") or ""
        record = (self.holder, spec.get("renewTime"), spec.get("leaseDurationSeconds"))
        if record != self._observed:
            self._observed = record
            self._observed_at = self.clock()

    # -- the loops ------------------------------------------------------------------------------
    async def acquire(self) -> None:
        """Wait until we are the leader. Every failed attempt logs one error line."""
        log.info("Attempting to acquire leader lease", extra={"kv": {"lease": f"{self.namespace}/{self.name}", "identity": self.identity}})
        told = False
        while True:
            try:
                if await self.try_acquire_or_renew():
                    if not self.opening:
                        self._set_leader(True)
                        log.info("Successfully acquired lease", extra={"kv": {"lease": f"{self.namespace}/{self.name}"}})
                        return
                    if not told:  # we created it: renew it until our fence may open
                        told = True
                        log.info(
                            "Created the lease; leading once it has stood for the renew deadline",
                            extra={"kv": {"lease": f"{self.namespace}/{self.name}", "waitSeconds": self.renew_deadline}},
                        )
            except ApiError as exc:
                log.error(str(exc), extra={"kv": {"lease": f"{self.namespace}/{self.name}", "retryIn": self.retry_period}})
            await asyncio.sleep(self.retry_period * (1 + random.random() * 0.2))

    async def hold(self) -> None:
        """Renew every ``retry_period``; return once the Lease is lost — no later than
        ``renewed_at + renew_deadline``, or at once when another holder is seen."""
        lease = f"{self.namespace}/{self.name}"
        while True:
            await asyncio.sleep(self.retry_period)
            while True:  # one renew round
                assert self.renewed_at is not None
                deadline = self.renewed_at + self.renew_deadline
                if self._expired or self.clock() >= deadline:
                    return self.lose(f"no successful renewal for {self.clock() - self.renewed_at:.3g} s")
                try:
                    if await self.try_acquire_or_renew(deadline):
                        if self._expired:  # the fence closed while this renewal was in flight
                            continue
                        break
                    if self.gone:
                        return self.lose("the Lease was deleted")
                    if self.holder and self.holder != self.identity:
                        return self.lose(f"the Lease is held by {self.holder}")
                except ApiError as exc:
                    log.warning("Failed to renew lease", extra={"kv": {"lease": lease, "error": str(exc)}})
                remaining = deadline - self.clock()
                if remaining <= 0:
                    continue  # the check above reports the loss
                await asyncio.sleep(min(self.retry_period, remaining))

    def lose(self, why: str, *, quiet: bool = False) -> None:
        """Stop leading now (the fence closes); the Lease is left to expire, not released.
        ``quiet``: the caller logs the loss itself."""
        self._set_leader(False)
        self._lease = None
        if not quiet:
            log.error("Leader election lost", extra={"kv": {"lease": f"{self.namespace}/{self.name}", "reason": why}})

    async def release(self) -> None:
        """Give the Lease up (if we hold it) so a standby takes over at once — unless a call
        under it still runs (:attr:`running`): then it is left to expire."""
        if not self.is_leader:
            return
        self._set_leader(False)
        busy = self.running() if self.running is not None else 0
        if busy:
            self._lease = None
            log.warning(
                "Leaving the Lease to expire: calls under it still run",
                extra={"kv": {"lease": f"{self.namespace}/{self.name}", "running": busy, "expiresIn": self.lease_duration}},
            )
            return
        try:
            lease = self._lease
            if lease is None:
                lease = await self._request("GET", f"{self._path}/{self.name}")
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            spec.update({"holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": _now_micro(self.wall_clock)})
            lease["spec"] = spec
            try:
                await self._request("PUT", f"{self._path}/{self.name}", lease)
            except Conflict:
                # our copy was stale: re-read, and release only if the record is still ours
                lease = await self._request("GET", f"{self._path}/{self.name}")
                spec = lease.get("spec") or {}
                if spec.get("holderIdentity") != self.identity:
                    return
                spec.update({"holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": _now_micro(self.wall_clock)})
                await self._request("PUT", f"{self._path}/{self.name}", lease)
            log.log(self.release_level, "Released leader lease", extra={"kv": {"lease": f"{self.namespace}/{self.name}"}})
        except ApiError as exc:
            log.warning("Could not release lease", extra={"kv": {"error": str(exc)}})
        finally:
            self._lease = None
