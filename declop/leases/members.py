"""Who is live: what one replica reads from each LIST of the namespace's Leases about the others.

A replica counts the member Leases of its controllers (``<id>-<controller>-of-<n>-member-…``)
and watches the range Leases of other splits of the same controller (``-shard-<i>-of-<m>``,
another ``--shards``). Every judgement is made on our own clock from when a record was first
seen unchanged, never from the times written in it. :mod:`declop.leases.shards` acts on the
answers; why the rules are safe is in docs/leases.md.

Rules:

- a member is live while its record changed within its ``leaseDurationSeconds``; live replicas
  of a controller are the live members of the same controller *and* the same ``n``, plus
  ourselves; members of other controllers or splits under our id are logged once per kind;
- a member Lease unrenewed for :data:`FORGET_AFTER` of its durations is forgotten (and deleted);
- another split holds a range only while its record changed within a lease duration (a renew
  deadline more when that split is the smaller one, so the smaller split takes first), and only
  if its holder is live.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Iterable

from declop.clock import Clock
from declop.leases.ranges import ShardSet, dns_label

__all__ = ["FORGET_AFTER", "Members"]

log = logging.getLogger("declop.shardlease")

#: a member Lease unrenewed for this many of its durations is deleted by the other replicas
FORGET_AFTER = 10
_RANGE = re.compile(r"-shard-\d+-of-\d+$")  # the end of a range Lease's name

#: what a Lease's record is compared by: (holderIdentity, renewTime, leaseDurationSeconds)
Record = tuple[Any, Any, Any]


def _record(spec: dict[str, Any]) -> Record:
    return (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseDurationSeconds"))


class Members:
    """The member and other-split records one replica has seen, each with when it first saw it."""

    def __init__(self, lease_id: str, identity: str, *, lease_duration: float, renew_deadline: float, clock: Clock) -> None:
        self.identity = identity
        self.lease_duration, self.renew_deadline = lease_duration, renew_deadline
        self.clock = clock
        #: every member Lease under our id starts with this (any controller, any ``n``)
        self.prefix = f"{dns_label(lease_id)}-"
        #: member Lease -> (record, first seen)
        self.records: dict[str, tuple[Record, float]] = {}
        #: another split's range Lease -> (record, first seen): one unchanged for long holds nothing
        self.splits: dict[str, tuple[Record, float]] = {}
        #: the live member Leases as last counted (not ours)
        self.live_names: set[str] = set()
        #: member prefixes of other controllers / splits, logged once each
        self.foreign: set[str] = set()

    def count(self, leases: dict[str, dict[str, Any]], sets: Iterable[ShardSet]) -> set[Any]:
        """Note every member Lease under our id (any controller, any ``n``) in one LIST's
        ``leases`` (name -> spec); returns the identities of the live members, ourselves
        included: a range they hold is not free."""
        sets = list(sets)
        now = self.clock()
        live: set[str] = set()
        seen = set()
        ours = {s.member.name for s in sets if s.member is not None}
        holders: set[Any] = {self.identity}
        for name, spec in leases.items():
            if not name.startswith(self.prefix) or "-member-" not in name or name in ours or _RANGE.search(name):
                continue  # not a member Lease (a controller's name may hold "-member-")
            seen.add(name)
            record = _record(spec)
            old = self.records.get(name)
            if old is None or old[0] != record:
                self.records[name] = old = (record, now)
            duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
            if record[0] and now < old[1] + duration:
                live.add(name)
                holders.add(record[0])
        for name in set(self.records) - seen:
            del self.records[name]
        self.live_names = live
        self._note_foreign(live, sets)
        return holders

    def live(self, s: ShardSet) -> int:
        """Live replicas of ``s``'s controller with ``s``'s ``n`` (ourselves included)."""
        prefix = s.member_prefix
        return 1 + sum(1 for name in self.live_names if name.startswith(prefix))

    def forgotten(self) -> list[str]:
        """The member Leases nobody renewed for :data:`FORGET_AFTER` of their durations (replicas
        killed or gone without a graceful stop), forgotten here: the caller deletes them."""
        now = self.clock()
        gone = []
        for name, (record, since) in list(self.records.items()):
            if now >= since + FORGET_AFTER * float(record[2] or self.lease_duration):
                del self.records[name]
                gone.append(name)
        return gone

    def other_split(self, s: ShardSet, leases: dict[str, dict[str, Any]], live: set[Any]) -> tuple[str, int]:
        """A range Lease of ``s``'s controller for another number of ranges, held by a ``live``
        replica, and that number (``("", 0)`` if none): its ranges overlap ours, so we must not
        take any. Held means renewed: a record unchanged for a lease duration on our clock (a
        renew deadline more when its split is the smaller one) holds nothing, whoever it names."""
        prefix, own = s.electors[0].name.rsplit("-shard-", 1)[0] + "-shard-", f"-of-{s.n}"
        now = self.clock()
        found: tuple[str, int] = ("", 0)
        for name, spec in leases.items():
            if not name.startswith(prefix) or name.endswith(own) or _RANGE.search(name) is None:
                continue
            record = _record(spec)
            old = self.splits.get(name)
            if old is None or old[0] != record:
                self.splits[name] = old = (record, now)
            if found[0] or record[0] not in live:
                continue
            n_text = name.rsplit("-of-", 1)[1]
            n = int(n_text) if n_text.isdigit() else 0
            duration = float(record[2] or self.lease_duration)
            if now < old[1] + duration + (self.renew_deadline if s.n > n else 0.0):
                found = (name, n)
        for name in set(self.splits) - set(leases):
            del self.splits[name]
        return found

    def _note_foreign(self, live: set[str], sets: list[ShardSet]) -> None:
        """Log once per kind of member Lease under our id that is not of our controllers and
        ``n``: another operator shares ``--leader-election-id``, or replicas disagree on
        ``--shards`` (each side then counts only its own kind)."""
        own = {s.member_prefix for s in sets}
        for name in live:
            prefix = name.rsplit("-member-", 1)[0] + "-member-"
            if prefix in own or prefix in self.foreign:
                continue
            self.foreign.add(prefix)
            log.warning(
                "Another operator, or a replica with another --shards, shares this --leader-election-id; "
                "counting only the replicas of the same controller and --shards",
                extra={"kv": {"theirs": prefix.removeprefix(self.prefix)[: -len("-member-")], "ours": sorted(f"{s.controller}-of-{s.n}" for s in sets)}},
            )
