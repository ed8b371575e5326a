"""Range Leases: the balancing plan, the hash and ranges, and whole replicas driven round by round
against an in-memory Lease store on a fake clock (the protocol, not the network; the integration
tests run real processes)."""

from __future__ import annotations

import asyncio
import copy
import logging
from typing import Any

import pytest

from declop.clock import FakeClock
from declop.errors import ApiError, ConfigError, Conflict, NotFound
from declop.serving.metrics import Metrics
from declop.leases.hashing import fnv1a64, range_index, split
from declop.leases.shards import ShardLeases, ShardSet, lease_name, plan
from declop.testing.simulation.loop import VirtualLoop


class Leases:
    """GET, LIST, POST, PUT (with resourceVersion checks) and DELETE of Leases in one namespace."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}
        self.rv = 0

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        tail = path.rsplit("/leases", 1)[1].strip("/")
        if method == "GET" and not tail:
            return {"items": [copy.deepcopy(v) for v in self.items.values()]}
        if method == "GET":
            if tail not in self.items:
                raise NotFound()
            return copy.deepcopy(self.items[tail])
        if method == "DELETE":
            if self.items.pop(tail, None) is None:
                raise NotFound()
            return {}
        name = body["metadata"]["name"]
        if method == "POST" and name in self.items:
            raise Conflict()
        if method == "PUT" and body["metadata"].get("resourceVersion") != self.items.get(name, {}).get("metadata", {}).get("resourceVersion"):
            raise Conflict()
        self.rv += 1
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(self.rv)
        self.items[name] = stored
        return copy.deepcopy(stored)

    def holders(self, n: int = 12) -> dict[int, str]:
        return {
            i: (self.items.get(lease_name("t", "c", i, n)) or {}).get("spec", {}).get("holderIdentity") or ""
            for i in range(n)
        }


def free_leases(store: Leases, controller: str, n: int) -> None:
    """The ``n`` range Leases of ``controller`` exist, free, as an earlier run left them (a
    missing one is created only a lease duration after it was found missing)."""
    for i in range(n):
        free = {"metadata": {"name": lease_name("t", controller, i, n), "namespace": "ns", "resourceVersion": "0"}, "spec": {}}
        store.items.setdefault(lease_name("t", controller, i, n), free)


def replica(store: Leases, clock: FakeClock, name: str, n: int = 12) -> ShardLeases:
    """A replica of controller "c" in ``n`` ranges, whose range Leases exist, free."""
    free_leases(store, "c", n)
    r = ShardLeases(store, lease_id="t", namespace="ns", lease_duration=4, renew_deadline=3, retry_period=0.5, clock=clock, metrics=Metrics(), identity=name)
    r.add("c", n, "uid")
    return r


def rounds(clock: FakeClock, replicas: list[ShardLeases], n: int = 1, store: Leases | None = None) -> None:
    """``n`` rounds of every replica, 0.5 s apart; after each, no range has two valid holders."""
    async def go() -> None:
        for _ in range(n):
            for r in replicas:
                await r.step()
            if store is not None:
                check_exclusive(replicas)
            clock.advance(0.5)

    asyncio.run(go())


def check_exclusive(replicas: list[ShardLeases]) -> None:
    for i in range(12):
        fenced_in = [r.identity for r in replicas if r.sets["c"].may_start(i)]
        assert len(fenced_in) <= 1, f"range {i} open on {fenced_in}"


def test_plan_drains_the_excess_highest_first_and_fills_up_to_the_share() -> None:
    assert plan(range(6), [], [], live=4, n=12) == ([3, 4, 5], [])
    assert plan([], [], range(12), live=3, n=12) == ([], [0, 1, 2, 3])
    assert plan([0, 1], [], [5, 6, 7], live=3, n=12) == ([], [5, 6])
    assert plan([0, 1, 2, 3, 4], [4], [], live=3, n=12) == ([], [])  # 4 draining: 4 kept
    assert plan([0], [], [1, 2], live=5, n=12) == ([], [1, 2])  # ceil(12 / 5) = 3


def test_a_key_s_range_is_the_one_of_declop_sharding_whose_bounds_hold_its_hash() -> None:
    s = ShardSet("c", 12, "uid", [])
    for value in ["", "a", "0f1e2d3c-uid", "kube-system", *(f"uid-{i}" for i in range(200))]:
        i = s.index(value)
        assert i == range_index(fnv1a64(value), 12)
        assert s.ranges[i].start <= fnv1a64(value) < s.ranges[i].end
    assert s.ranges == split(12)


def test_lease_names_are_dns_safe() -> None:
    assert lease_name("declop", "My_Controller.v2", 3, 16) == "declop-my-controller-v2-shard-3-of-16"


def test_timings_are_validated_like_leader_election() -> None:
    with pytest.raises(ConfigError, match="lease_duration > renew_deadline"):
        ShardLeases(Leases(), lease_id="t", namespace="ns", lease_duration=3, renew_deadline=3)


def test_three_replicas_settle_on_four_ranges_each_without_ever_sharing_one() -> None:
    clock, store = FakeClock(), Leases()
    reps = [replica(store, clock, x) for x in "abc"]
    rounds(clock, reps, 6, store)
    counts = {x: list(store.holders().values()).count(x) for x in "abc"}
    assert counts == {"a": 4, "b": 4, "c": 4}
    assert all(r.live == 3 for r in reps)


def test_a_draining_range_is_fenced_at_once_and_released_only_when_idle() -> None:
    clock, store = FakeClock(), Leases()
    a = replica(store, clock, "a")
    rounds(clock, [a], 3, store)
    assert len(a.sets["c"].held()) == 12
    busy = 11
    a.sets["c"].begin(busy)  # a reconcile of range 11 runs
    b = replica(store, clock, "b")
    rounds(clock, [a, b], 3, store)
    s = a.sets["c"]
    assert busy in s.draining and not s.may_start(busy)
    assert store.holders()[busy] == "a", "released while a reconcile of it ran"
    s.end(busy)
    rounds(clock, [a, b], 4, store)
    assert store.holders()[busy] == "b"
    assert {x: list(store.holders().values()).count(x) for x in "ab"} == {"a": 6, "b": 6}


def test_a_dead_replicas_fence_closes_on_its_own_clock_and_others_take_over_after_expiry() -> None:
    clock, store = FakeClock(), Leases()
    reps = [replica(store, clock, x) for x in "abc"]
    rounds(clock, reps, 6, store)
    dead = reps[2]
    held = dead.sets["c"].held()
    assert all(dead.sets["c"].may_start(i) for i in held)
    clock.advance(3.0)  # renew_deadline without a round: the fence is closed, no request needed
    assert not any(dead.sets["c"].may_start(i) for i in held)
    rounds(clock, reps[:2], 12, store)  # > lease duration + 2 retry periods later
    holders = store.holders()
    assert all(holders[i] in ("a", "b") for i in held)
    assert all(r.live == 2 for r in reps[:2])


def test_a_range_lost_while_its_reconcile_runs_fails_the_replica() -> None:
    clock, store = FakeClock(), Leases()
    a = replica(store, clock, "a")
    rounds(clock, [a], 3, store)
    a.sets["c"].begin(0)
    clock.advance(5.0)  # frozen past the lease
    rounds(clock, [a], 1)
    assert a.failed.is_set()
    assert not a.sets["c"].may_start(0)


def test_a_call_that_ends_past_the_renew_deadline_before_the_round_sees_it_still_fails_the_replica() -> None:
    """The order the loop runs things in after a SIGCONT must not matter: the call (its thread
    resumed first) ends before the renewal round notices the Lease lapsed. It ran when the
    Lease lapsed, so the loss is one under a running call — the replica exits, it does not
    rejoin with a call that overlapped the next owner's."""
    clock, store = FakeClock(), Leases()
    a = replica(store, clock, "a")
    rounds(clock, [a], 3, store)
    s = a.sets["c"]
    s.begin(0)
    clock.advance(5.0)  # frozen past the lease, inside the call
    s.end(0)  # the call ends first
    assert not s.in_flight[0] and s.busy(0)
    rounds(clock, [a], 1)
    assert a.failed.is_set()
    assert not s.busy(0) and not s.may_start(0)


def test_a_call_that_ends_within_the_renew_deadline_leaves_nothing_behind() -> None:
    clock, store = FakeClock(), Leases()
    a = replica(store, clock, "a")
    rounds(clock, [a], 3, store)
    s = a.sets["c"]
    s.begin(0)
    clock.advance(1.0)
    s.end(0)
    assert not s.busy(0) and s.may_start(0)
    rounds(clock, [a], 12, store)
    assert not a.failed.is_set() and len(s.held()) == 12


def test_replicas_of_another_split_take_nothing_while_the_old_one_lives() -> None:
    clock, store = FakeClock(), Leases()
    old = replica(store, clock, "old", n=12)
    rounds(clock, [old], 3)
    new = replica(store, clock, "new", n=16)
    rounds(clock, [old, new], 6)
    assert new.sets["c"].held() == []
    asyncio.run(old.release_all())
    rounds(clock, [new], 4)
    assert len(new.sets["c"].held()) == 16


def test_graceful_release_frees_every_range_and_deletes_the_member_lease() -> None:
    clock, store = FakeClock(), Leases()
    a = replica(store, clock, "a")
    rounds(clock, [a], 3)
    asyncio.run(a.release_all())
    assert set(store.holders().values()) == {""}
    assert not [n for n in store.items if "-member-" in n]
    assert a.metrics.shard_ranges.labels("c")._value.get() == 0
    assert a.metrics.shard_handovers.labels("c", "released")._value.get() == 12


def test_a_replica_whose_clock_jumps_forward_starts_nothing_and_takes_nothing_early() -> None:
    """A suspend/resume seen by LEASE_CLOCK: one replica's clock jumps an hour while the others
    (their clocks moving at the real rate) go on. Its fences close on the jump alone, before any
    request; the others take its ranges once expired on their clocks; when it runs again it never
    opens a fence of a range another replica holds, and rejoins with its share."""
    shared, own, store = FakeClock(), FakeClock(), Leases()
    a, b = replica(store, shared, "a"), replica(store, shared, "b")
    c = replica(store, own, "c")
    reps = [a, b, c]

    async def round_all(members: list[ShardLeases]) -> None:
        for r in members:
            await r.step()
        check_exclusive(reps)
        shared.advance(0.5)
        own.advance(0.5)

    async def go() -> None:
        for _ in range(8):
            await round_all(reps)
        held = c.sets["c"].held()
        assert len(held) == 4 and all(c.sets["c"].may_start(i) for i in held)
        own.advance(3600)  # c was suspended for an hour
        assert not any(c.sets["c"].may_start(i) for i in held), "fences closed by the jump alone"
        for _ in range(12):  # meanwhile the others' clocks move 6 s: c's Leases expire for them
            await round_all([a, b])
        assert all(store.holders()[i] in ("a", "b") for i in held)
        for _ in range(20):  # c runs again: it notices, drops, and rejoins through balancing
            await round_all(reps)
        assert sorted(len(r.sets["c"].held()) for r in reps) == [4, 4, 4]

    asyncio.run(go())



def test_after_an_outage_past_the_renew_deadline_every_range_is_owned_again() -> None:
    """The apiserver is gone for longer than the lease duration: every replica's fences close
    while the range Leases still name it, and each sees the others' ranges as held by a live
    replica. Each must take its own again (nobody else will), so every range is open on exactly
    one replica again and the split is even, instead of ranges owned on paper only."""
    clock, store = FakeClock(), Leases()
    reps = [replica(store, clock, x) for x in "ab"]
    rounds(clock, reps, 6, store)
    assert {x: list(store.holders().values()).count(x) for x in "ab"} == {"a": 6, "b": 6}
    real = store.request

    async def down(*_: Any, **__: Any) -> Any:
        raise ApiError(0, "Unavailable", "cannot reach the apiserver")

    store.request = down  # type: ignore[method-assign]

    async def outage() -> None:
        for _ in range(12):  # 6 s > lease duration
            for r in reps:
                with pytest.raises(ApiError):
                    await r.step()
            clock.advance(0.5)

    asyncio.run(outage())
    assert not any(r.sets["c"].may_start(i) for r in reps for i in range(12)), "every fence closed"
    assert set(store.holders().values()) == {"a", "b"}, "the records still name the old holders"
    store.request = real  # type: ignore[method-assign]
    rounds(clock, reps, 4, store)
    open_on = {i: [r.identity for r in reps if r.sets["c"].may_start(i)] for i in range(12)}
    assert all(len(v) == 1 for v in open_on.values()), open_on
    assert {x: list(store.holders().values()).count(x) for x in "ab"} == {"a": 6, "b": 6}


def test_a_deleted_member_lease_is_created_again_at_once() -> None:
    """Only its replica ever holds a member Lease, so unlike a range Lease (issue 22, defect 7)
    it needs no wait when someone deletes it."""
    clock, store = FakeClock(), Leases()
    a = replica(store, clock, "a")
    rounds(clock, [a], 2, store)
    member = a.member.name
    assert member in store.items
    del store.items[member]
    rounds(clock, [a], 1, store)
    assert member in store.items and a.member.is_leader and a.member.valid()


def test_another_operator_under_the_same_id_is_not_counted_and_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 22, defect 4: two replicas of controller ``c`` and two of another operator's
    controller ``d`` share the id. Each side counts only its own members, so each owns all of
    its ranges (before, each counted four replicas and took a share of 3 of 12: half unowned)."""
    clock, store = FakeClock(), Leases()
    ours = [replica(store, clock, x) for x in "ab"]
    theirs = []
    free_leases(store, "d", 5)
    for x in "xy":
        r = ShardLeases(store, lease_id="t", namespace="ns", lease_duration=4, renew_deadline=3, retry_period=0.5, clock=clock, identity=x)
        r.add("d", 5, "uid")
        theirs.append(r)
    with caplog.at_level("WARNING", logger="declop.shardlease"):
        rounds(clock, ours + theirs, 8)
    check_exclusive(ours)
    assert {x: list(store.holders().values()).count(x) for x in "ab"} == {"a": 6, "b": 6}
    d = {i: (store.items.get(lease_name("t", "d", i, 5)) or {}).get("spec", {}).get("holderIdentity") for i in range(5)}
    assert sorted(d.values()) == ["x", "x", "x", "y", "y"]
    assert all(r.live == 2 for r in ours + theirs)
    shared = [r for r in caplog.records if r.getMessage().startswith("Another operator, or a replica with another --shards")]
    assert len(shared) == 4, "one line per replica, not one per round"
    assert shared[0].kv["theirs"] in ("d-of-5", "c-of-12")


def test_replicas_with_another_shards_do_not_shrink_the_old_ones_share() -> None:
    """Defect 4, a rolling change stopped part-way: one old replica (12 ranges) and two new
    ones (16). The new ones wait; the old one must own all 12 (before, it counted three
    replicas, kept 4 and left 8 to nobody, for ever)."""
    clock, store = FakeClock(), Leases()
    old = replica(store, clock, "old", n=12)
    new = [replica(store, clock, x, n=16) for x in ("new1", "new2")]
    rounds(clock, [old, *new], 10, store)
    assert old.sets["c"].held() == list(range(12)) and old.live == 1
    assert [r.sets["c"].held() for r in new] == [[], []]


def test_two_splits_that_both_took_ranges_the_larger_gives_way() -> None:
    clock, store = FakeClock(), Leases()
    small, large = replica(store, clock, "small", n=12), replica(store, clock, "large", n=16)

    async def both_take_at_once() -> None:
        for r in (small, large):
            await r.renew()
        for r in (small, large):
            await r.balance(False)  # both see the other's member, nobody holds a range yet
        clock.advance(0.5)
        await asyncio.gather(small.balance(), large.balance())

    asyncio.run(both_take_at_once())
    assert small.sets["c"].held() and large.sets["c"].held()
    rounds(clock, [small, large], 6)
    assert large.sets["c"].held() == [] and small.sets["c"].held() == list(range(12))


def test_a_replica_whose_caches_never_synced_joins_nothing_and_takes_nothing() -> None:
    """Defect 6: its member Lease is not even created, so the others keep its share."""
    clock, store = FakeClock(), Leases()
    a, stuck = replica(store, clock, "a"), replica(store, clock, "stuck")
    stuck.sets["c"].synced = lambda: False
    rounds(clock, [a, stuck], 6, store)
    assert a.sets["c"].held() == list(range(12)) and a.live == 1
    assert stuck.sets["c"].held() == [] and stuck.member.name not in store.items
    stuck.sets["c"].synced = lambda: True  # synced at last: it joins and gets its share
    rounds(clock, [a, stuck], 8, store)
    assert {x: list(store.holders().values()).count(x) for x in ("a", "stuck")} == {"a": 6, "stuck": 6}


def test_renewals_go_on_while_every_request_is_slow() -> None:
    """Defect 9: every request answers, but only after 1.4 s (its timeout is 1.5 s). The
    renewal of the held ranges must not wait for the rest of the round. Before, a round made
    three such requests one after the other (member, ranges, LIST), renewals came 4.2 s apart
    and every range was lost at its 3-s renew deadline. On virtual time."""
    loop = VirtualLoop()

    async def go() -> None:
        store = Leases()
        a = ShardLeases(store, lease_id="t", namespace="ns", lease_duration=4, renew_deadline=3, retry_period=0.5, identity="a", clock=loop.time)
        a.add("c", 12, "uid")
        running = asyncio.ensure_future(a.run())
        while not all(a.sets["c"].may_start(i) for i in range(12)):  # held, and open (created: 3 s later)
            await asyncio.sleep(0.05)
        real = store.request

        async def slow(method: str, path: str, body: Any = None, **kw: Any) -> Any:
            await asyncio.sleep(1.4)
            return await real(method, path, body, **kw)

        store.request = slow  # type: ignore[method-assign]
        renewed = {i: e.renewed_at for i, e in enumerate(a.sets["c"].electors)}
        until = loop.time() + 8.0  # > renew_deadline: every range would have been lost
        try:
            while loop.time() < until:
                await asyncio.sleep(0.1)
                assert all(a.sets["c"].may_start(i) for i in range(12)), "a range was lost"
            assert all(e.renewed_at is not None and e.renewed_at > (renewed[i] or 0) + 3.0 for i, e in enumerate(a.sets["c"].electors))
            assert not a.failed.is_set()
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)

    try:
        loop.run_until_complete(go())
    finally:
        loop.close()


def test_a_controller_named_like_a_member_lease_is_not_counted_as_one() -> None:
    clock, store = FakeClock(), Leases()
    reps = []
    free_leases(store, "team-member-sync", 4)
    for x in "ab":
        r = ShardLeases(store, lease_id="t", namespace="ns", lease_duration=4, renew_deadline=3, retry_period=0.5, clock=clock, identity=x)
        r.add("team-member-sync", 4, "uid")
        reps.append(r)
    rounds(clock, reps, 8)
    assert all(r.live == 2 for r in reps) and sorted(len(r.sets["team-member-sync"].held()) for r in reps) == [2, 2]
    assert not reps[0].members.foreign


def test_release_all_leaves_a_range_with_a_reconcile_in_flight_to_expire_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 22, defect 2: a range whose reconcile still runs (a plain handler's thread outlived
    the grace period) is not released; its fence closes, one line names it, the rest go."""
    clock, store = FakeClock(), Leases()
    a = replica(store, clock, "a", n=4)
    rounds(clock, [a], 3)
    s = a.sets["c"]
    assert s.held() == [0, 1, 2, 3]
    s.begin(2)
    with caplog.at_level(logging.WARNING, logger="declop.shardlease"):
        asyncio.run(a.release_all())
    assert store.holders(4) == {0: "", 1: "", 2: "a", 3: ""}
    assert not s.may_start(2) and s.held() == []
    (line,) = [r for r in caplog.records if r.getMessage() == "Leaving shard leases to expire: reconciles of them still run"]
    assert line.kv["shards"] == ["2/4"]  # type: ignore[attr-defined]


def test_in_a_fresh_namespace_every_range_is_owned_about_one_lease_duration_later() -> None:
    """No range Lease exists yet (the first start): none is created before a lease duration (4 s
    here) has passed since it was found missing — and that wait starts for every range at the
    first LIST, tried or not, so the whole split is owned soon after, not one lease duration per
    batch of tries (before the LIST counted, 12 ranges on 3 replicas took three)."""
    clock, store = FakeClock(), Leases()
    replicas = []
    for name in "abc":
        r = ShardLeases(store, lease_id="t", namespace="ns", lease_duration=4, renew_deadline=3, retry_period=0.5, clock=clock, metrics=Metrics(), identity=name)
        r.add("c", 12, "uid")
        replicas.append(r)
    rounds(clock, replicas, 7, store)  # 3.5 s
    assert set(store.holders().values()) == {""} and not [n for n in store.items if "-shard-" in n]
    rounds(clock, replicas, 9, store)  # 8 s
    assert "" not in store.holders().values(), store.holders()


@pytest.mark.parametrize("lease_id", ["sharding-op", "my-shard-operator"])
def test_an_id_with_shard_in_it_still_counts_the_other_replicas(lease_id: str) -> None:
    """The member prefix was cut at the first ``-shard-`` of the range Lease's name: with an id
    like ``my-shard-operator`` every replica looked for members no one writes, counted itself
    alone and took every range it could (found by issue 40's daemon tests)."""
    clock, store = FakeClock(), Leases()
    n = 12

    def rep(name: str) -> ShardLeases:
        for i in range(n):
            lease = lease_name(lease_id, "c", i, n)
            store.items.setdefault(lease, {"metadata": {"name": lease, "namespace": "ns", "resourceVersion": "0"}, "spec": {}})
        r = ShardLeases(store, lease_id=lease_id, namespace="ns", lease_duration=4, renew_deadline=3, retry_period=0.5,
                        clock=clock, metrics=Metrics(), identity=name)  # fmt: skip
        r.add("c", n, "uid")
        return r

    reps = [rep(x) for x in "ab"]
    assert reps[0].sets["c"].member_prefix == f"{lease_id}-c-of-{n}-member-"
    rounds(clock, reps, 8, store)
    assert all(r.live == 2 for r in reps)
    held = {r.identity: len(r.sets["c"].held()) for r in reps}
    assert held == {"a": 6, "b": 6}, held


def test_an_id_with_shard_in_it_does_not_take_another_controller_for_another_split() -> None:
    """The other-split check cut the name at the first '-shard-' too: with such an id, the range
    Leases of *another controller* with another number of ranges looked like a live split of this
    one, and this controller never took a range."""
    clock, store = FakeClock(), Leases()
    lease_id = "my-shard-operator"

    def rep(name: str, controller: str, n: int) -> ShardLeases:
        for i in range(n):
            lease = lease_name(lease_id, controller, i, n)
            store.items.setdefault(lease, {"metadata": {"name": lease, "namespace": "ns", "resourceVersion": "0"}, "spec": {}})
        r = ShardLeases(store, lease_id=lease_id, namespace="ns", lease_duration=4, renew_deadline=3, retry_period=0.5,
                        clock=clock, metrics=Metrics(), identity=name)  # fmt: skip
        r.add(controller, n, "uid")
        return r

    other = rep("other", "d", 8)
    rounds(clock, [other], 4)
    assert len(other.sets["d"].held()) == 8
    mine = rep("mine", "c", 12)
    rounds(clock, [other, mine], 6)
    assert len(mine.sets["c"].held()) == 12  # controller d's 8-way ranges are not c's other split
