"""One controller's hash ranges on this replica: their Leases' names, electors, drains and calls
in flight, and the balancing plan — bookkeeping only; :mod:`declop.leases.shards` drives the
Leases (the protocol and why it is safe: docs/leases.md).

Invariants:

- :meth:`ShardSet.may_start` is True only while the range's elector is ``valid()`` and the range
  is not draining;
- ``in_flight`` counts every reconcile of a range from :meth:`ShardSet.begin` to
  :meth:`ShardSet.end`: a range is released only when it holds none;
- a call that ends once its range's Lease is held but no longer live (its renew deadline passed
  on our clock while the call ran: a freeze, a partition) leaves the range in ``overran`` until
  the loss is reported — that loss happened under a running call, whichever of the call's end
  and the renewal round's check the loop ran first;
- :func:`plan` is pure: held ranges count against ``ceil(n / live)``, the excess is drained
  highest index first, and only as many candidates are tried as the share lacks.
"""

from __future__ import annotations

import collections
import math
import re
from typing import Callable, Iterable

from declop.leases.hashing import ShardRange, fnv1a64, range_index, split
from declop.leases.leader import LeaderElector

__all__ = ["ShardSet", "dns_label", "lease_name", "member_prefix", "plan"]


def dns_label(text: str) -> str:
    """``text`` as a DNS label part: lower case, runs of anything else as one ``-``."""
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-") or "x"


def lease_name(lease_id: str, controller: str, index: int, n: int) -> str:
    """The range Lease's name: ``<id>-<controller>-shard-<i>-of-<n>`` (DNS-safe)."""
    return f"{dns_label(lease_id)}-{dns_label(controller)}-shard-{index}-of-{n}"


def member_prefix(controller_prefix: str, n: int) -> str:
    """``<id>-<controller>-of-<n>-member-``: replicas count only the members of their own
    controller and ``n`` (another operator under the same id, or a replica with another
    ``--shards``, is not one that makes room or takes a share)."""
    return f"{controller_prefix}-of-{n}-member-"


def plan(held: Iterable[int], draining: Iterable[int], candidates: Iterable[int], live: int, n: int) -> tuple[list[int], list[int]]:
    """One balancing step: ``(to_drain, to_try)``.

    ``held`` ranges (``draining`` among them) count against the share ``ceil(n / live)``;
    the excess among the non-draining ones is drained, highest index first; under the share,
    ``candidates`` (free or not held by a live replica) are tried in order, as many as missing."""
    share = math.ceil(n / max(1, live))
    held, draining = set(held), set(draining)
    keep = sorted(held - draining)
    drain = keep[share:] if len(keep) > share else []
    missing = share - len(held)
    tries = [c for c in candidates if c not in held][: max(0, missing)]
    return drain, tries


class ShardSet:
    """The ranges of one controller on this replica: electors, drains, in-flight counts.

    The controller calls :meth:`index`, :meth:`may_start`, :meth:`begin` and :meth:`end`;
    :class:`ShardLeases` drives the Leases."""

    def __init__(self, controller: str, n: int, shard_by: str, electors: list[LeaderElector], member: LeaderElector | None = None) -> None:
        self.controller, self.n, self.shard_by = controller, n, shard_by
        self.electors = electors
        #: this replica's member Lease for this controller and this ``n``; held only once
        #: :attr:`synced` says so (others count it then, and make room for it)
        self.member = member
        #: have this controller's caches synced? (the manager: the controller's sync gate)
        #: until then the replica joins nothing and takes no range: it could not reconcile them
        self.synced: Callable[[], bool] = lambda: True
        #: the ranges, by index (:func:`declop.leases.hashing.split`)
        self.ranges: tuple[ShardRange, ...] = split(n)
        #: ranges being drained: no reconcile starts for their keys; released once idle
        self.draining: set[int] = set()
        #: ranges we created and hold whose fence has not opened yet (queued once it does)
        self.opening: set[int] = set()
        #: range -> reconciles of its keys in flight
        self.in_flight: collections.Counter[int] = collections.Counter()
        #: held ranges a call outlived (it ended past the renew deadline): lost under that call
        self.overran: set[int] = set()
        #: called with a range index once it is ours (the controller queues its keys)
        self.on_gained: Callable[[int], None] | None = None
        #: called with a range index once it is not ours any more (released or lost)
        self.on_dropped: Callable[[int], None] | None = None
        self.warned = False  # logged that another split of the hash space is in use

    @property
    def member_prefix(self) -> str:
        """The name prefix of every replica's member Lease of this controller and this ``n``."""
        return member_prefix(self.electors[0].name.rsplit("-shard-", 1)[0], self.n) if self.electors else ""  # the last: ids may hold "-shard-"

    def index(self, value: str) -> int:
        """The range ``value`` (a uid or a namespace) hashes into."""
        return range_index(fnv1a64(value), self.n)

    def held(self) -> list[int]:
        return [i for i, e in enumerate(self.electors) if e.is_leader]

    def busy(self, index: int) -> bool:
        """Does a call of range ``index`` run, or did one run past its Lease (:attr:`overran`)?
        Either way the range's loss is a loss under a running call."""
        return bool(self.in_flight[index]) or index in self.overran

    def may_start(self, index: int) -> bool:
        """The fence: may a reconcile of a key of range ``index`` start now?"""
        return index not in self.draining and self.electors[index].valid()

    def begin(self, index: int) -> None:
        self.in_flight[index] += 1

    def end(self, index: int) -> None:
        e = self.electors[index]
        if e.is_leader and not e.live():
            self.overran.add(index)
        self.in_flight[index] -= 1
        if self.in_flight[index] <= 0:
            del self.in_flight[index]
