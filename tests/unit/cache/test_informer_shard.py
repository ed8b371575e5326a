"""The informer's shard filter against a scripted apiserver that knows nothing of shardSelector
(as an apiserver with the ShardedListAndWatch gate off): detection, client-side filtering,
set_shard, the guard against an apiserver that stops filtering, and the pool's keying.
The real apiserver, gate on and off: tests/integration/test_sharded_list_watch.py."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

import pytest

from declop.cache.backoff import Backoff
from declop.cache.informer import Informer, InformerPool
from declop.leases.hashing import ShardFilter, split
from declop.testing.fakes.listwatch import ListWatchServer

HALVES = split(2)
#: the names vary at the front: FNV-1a keeps the high bits of strings that differ only at the end
#: (uid-cm-00 … uid-cm-39 all hash into [0xc3f…]); real uids are random and spread
NAMES = [f"{i:02d}-cm" for i in range(40)]


def run(coro: Coroutine[Any, Any, Any], timeout: float = 30) -> Any:
    async def main() -> Any:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(main())


async def until(condition: Any, timeout: float = 15, what: str = "") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        await asyncio.sleep(0.01)


def in_half(server: ListWatchServer, half: int) -> set[str]:
    f = ShardFilter("uid", (HALVES[half],))
    return {name for name, obj in server.objects().items() if f.matches(obj)}


def store_names(informer: Informer) -> set[str]:
    return {o["metadata"]["name"] for o in informer.store}


@pytest.mark.parametrize("mode", ["auto", "paged"])
def test_an_apiserver_without_the_gate_means_client_side_filtering(mode: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "declop.informer")

    async def scenario() -> None:
        async with ListWatchServer() as server:
            for name in NAMES:
                server.add(name)
            informer = Informer(server.transport(), server.resource, namespace="default", list_mode=mode, shard=ShardFilter("uid", (HALVES[0],)))
            events: list[tuple[Any, Any]] = []
            informer.subscribe(lambda old, new: events.append((old, new)))
            informer.start()
            try:
                await asyncio.wait_for(informer.synced.wait(), 15)
                assert informer.shard_mode == "client"
                probe = server.requests[0]
                assert probe.verb == "list" and probe.query["limit"] == "1" and "shardRange(object.metadata.uid" in probe.query["shardSelector"]
                assert all("shardSelector" not in r.query for r in server.requests[1:]), "client-side: no selector after the probe"
                mine = in_half(server, 0)
                assert 0 < len(mine) < len(NAMES)
                assert store_names(informer) == mine and len(events) == len(mine)
                assert informer.dropped == len(NAMES) - len(mine)
                # watch events outside the range are dropped before the store and the handlers
                events.clear()
                for name in NAMES:
                    server.modify(name, {"v": "1"})
                await until(lambda: informer.events_received == len(NAMES), what="every watch event")
                assert sorted(new["metadata"]["name"] for _, new in events) == sorted(mine)
            finally:
                await informer.stop()

    run(scenario())
    assert any("filtering client-side" in r.getMessage() for r in caplog.records)


def test_set_shard_gains_by_a_sync_and_releases_without_deletions() -> None:
    async def scenario() -> None:
        async with ListWatchServer() as server:
            for name in NAMES:
                server.add(name)
            informer = Informer(server.transport(), server.resource, namespace="default", shard=ShardFilter("uid", (HALVES[0],)))
            events: list[tuple[Any, Any]] = []
            informer.subscribe(lambda old, new: events.append((old, new)))
            informer.start()
            try:
                await asyncio.wait_for(informer.synced.wait(), 15)
                events.clear()
                change = await informer.set_shard((HALVES[1],))
                assert {k.name for k in change.released} == in_half(server, 0)
                assert change.gained == (HALVES[1],) and change.relisted
                await until(lambda: store_names(informer) == in_half(server, 1), what="the other half in the store")
                assert all(old is None for old, _ in events), "additions only: no deletion for what left"
                assert informer.released == len(in_half(server, 0))
                # the same ranges again: nothing happens
                assert (await informer.set_shard((HALVES[1],))).released == ()
            finally:
                await informer.stop()

    run(scenario())


def test_an_apiserver_that_stops_filtering_costs_bandwidth_not_correctness(caplog: pytest.LogCaptureFixture) -> None:
    """Server mode (as if detected), but the apiserver sends everything: the informer still keeps
    only its ranges, and says so once."""
    caplog.set_level(logging.INFO, "declop.informer")

    async def scenario() -> None:
        async with ListWatchServer() as server:
            for name in NAMES:
                server.add(name)
            informer = Informer(server.transport(), server.resource, namespace="default", shard=ShardFilter("uid", (HALVES[0],)))
            informer.shard_mode = "server"
            informer.start()
            try:
                await asyncio.wait_for(informer.synced.wait(), 15)
                assert all("shardSelector" in r.query for r in server.requests)
                assert store_names(informer) == in_half(server, 0)
                assert informer.dropped == len(NAMES) - len(in_half(server, 0))
            finally:
                await informer.stop()

    run(scenario())
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "outside the shardSelector" in r.getMessage()]
    assert len(warnings) == 1


def test_set_shard_waits_for_a_sync_being_emitted() -> None:
    """A sync's changes are never cut short by a change of ranges."""

    async def scenario() -> None:
        async with ListWatchServer() as server:
            informer = Informer(server.transport(), server.resource, namespace="default", shard=ShardFilter("uid", (HALVES[0],)))
            sync = informer.listwatch.sync
            sync.emitting = 1  # as inside Sync.emit_all
            task = asyncio.ensure_future(informer.set_shard((HALVES[1],)))
            await asyncio.sleep(0.1)
            assert not task.done() and informer.shard.ranges == (HALVES[0],)
            sync.emitting = 0
            sync.calm.set()
            await asyncio.wait_for(task, 5)
            assert informer.shard.ranges == (HALVES[1],)

    run(scenario())


def test_concurrent_changes_apply_in_order() -> None:
    async def scenario() -> None:
        async with ListWatchServer() as server:
            for name in NAMES:
                server.add(name)
            informer = Informer(server.transport(), server.resource, namespace="default", shard=ShardFilter("uid", (HALVES[0],)))
            informer.start()
            try:
                await asyncio.wait_for(informer.synced.wait(), 15)
                first, second = await asyncio.gather(informer.set_shard(split(1)), informer.set_shard((HALVES[1],)))
                assert first.gained == (HALVES[1],) and {k.name for k in second.released} == in_half(server, 0)
                await until(lambda: store_names(informer) == in_half(server, 1), what="the last change to hold")
                assert informer.shard.ranges == (HALVES[1],)
            finally:
                await informer.stop()

    run(scenario())


def test_owning_nothing_caches_nothing_and_is_synced_once_one_small_list_succeeded() -> None:
    async def scenario() -> None:
        async with ListWatchServer() as server:
            server.add("a")
            informer = Informer(server.transport(), server.resource, namespace="default", shard=ShardFilter("uid", ()))
            informer.start()
            await asyncio.wait_for(informer.synced.wait(), 5)
            assert informer.store.synced and len(informer.store) == 0
            await asyncio.sleep(0.05)
            # one LIST of at most one object proves we may list; nothing is watched or cached
            assert [(r.verb, r.query.get("limit")) for r in server.requests] == [("list", "1")]
            await informer.stop()

    run(scenario())


def test_owning_nothing_while_the_list_is_refused_stays_unsynced_and_tries_again() -> None:
    """The simulator's `unsynced` fault, sharded (`declop sim examples/kopf/15_timers.py --seed
    16 --mode sharded`): a replica refused every list looked synced while it owned no range, took
    ranges (range Leases are gated on sync) and never listed them — their objects were never
    reconciled. Now it is synced only once a list succeeded."""

    async def scenario() -> None:
        async with ListWatchServer() as server:
            server.failing = 403
            informer = Informer(
                server.transport(), server.resource, namespace="default", shard=ShardFilter("uid", ()),
                backoff=Backoff(initial=0.01, cap=0.02),
            )
            informer.start()
            await asyncio.sleep(0.2)
            assert not informer.synced.is_set() and informer.last_error  # the refusal, as /readyz shows it
            assert len(server.requests) >= 3, "tried again, with the backoff"
            server.failing = None
            await asyncio.wait_for(informer.synced.wait(), 5)
            assert informer.last_error == "" and len(informer.store) == 0
            await informer.stop()

    run(scenario())


def test_bad_arguments_are_one_clear_line() -> None:
    from declop.kube.discovery import ResourceInfo

    resource = ResourceInfo(group="", version="v1", plural="configmaps", kind="ConfigMap", namespaced=True)
    with pytest.raises(ValueError, match="shard_filtering must be auto or client"):
        Informer(object(), resource, shard=ShardFilter("uid", ()), shard_filtering="server")  # type: ignore[arg-type]
    unsharded = Informer(object(), resource)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="is not sharded; create it with shard="):
        run(unsharded.set_shard(HALVES))


def test_pool_keys_sharded_informers_by_shard_key_not_ranges() -> None:
    from declop.kube.discovery import ResourceInfo

    resource = ResourceInfo(group="", version="v1", plural="configmaps", kind="ConfigMap", namespaced=True)
    pool = InformerPool(object())  # type: ignore[arg-type]
    by_uid = pool.get(resource, "ns", shard=ShardFilter("uid", (HALVES[0],)))
    assert pool.get(resource, "ns", shard=ShardFilter("uid", (HALVES[1],))) is by_uid
    assert by_uid.shard == ShardFilter("uid", (HALVES[0],)), "asking again does not change the ranges"
    by_ns = pool.get(resource, "ns", shard=ShardFilter("namespace", (HALVES[0],)))
    assert by_ns is not by_uid
    assert pool.existing(resource) == [by_uid], "one kind of informer for cache reads: no duplicates"
    full = pool.get(resource, "ns")
    assert pool.existing(resource) == [full], "an unsharded informer, when there is one, answers reads"


def test_a_transform_that_drops_the_uid_does_not_break_a_range_change() -> None:
    """set_shard hashes cached objects again: their uid is kept even if the transform drops it."""

    def slim(obj: Any) -> Any:
        return {"metadata": {k: obj["metadata"][k] for k in ("name", "namespace", "resourceVersion")}}

    async def scenario() -> None:
        async with ListWatchServer() as server:
            for name in NAMES:
                server.add(name)
            informer = Informer(server.transport(), server.resource, namespace="default", transform=slim, shard=ShardFilter("uid", split(1)))
            informer.start()
            try:
                await asyncio.wait_for(informer.synced.wait(), 15)
                assert all(o["metadata"]["uid"] for o in informer.store) and "data" not in next(iter(informer.store))
                change = await informer.set_shard((HALVES[0],))
                assert {k.name for k in change.released} == in_half(server, 1)
                assert store_names(informer) == in_half(server, 0)
            finally:
                await informer.stop()

    run(scenario())


def test_a_sync_owed_to_a_gained_range_is_owed_until_one_completes() -> None:
    """Where a range change leaves the list/watch loop: ranges only narrowed, a watch from the
    store's resourceVersion; a range gained, a sync — still owed by a narrowing that comes
    before that sync completes, no longer once it has."""
    from declop.cache.watch import EMPTY, WATCHING
    from declop.kube.discovery import ResourceInfo

    resource = ResourceInfo(group="", version="v1", plural="configmaps", kind="ConfigMap", namespaced=True)
    quarters = split(4)

    async def scenario() -> None:
        informer = Informer(object(), resource, namespace="default", shard=ShardFilter("uid", quarters[:2]))  # type: ignore[arg-type]
        await informer.listwatch.sync.replace([], "5", "paged")  # as after a first sync
        assert not (await informer.set_shard(quarters[:1])).relisted and informer.listwatch.state == WATCHING
        assert (await informer.set_shard(quarters[:3])).relisted and informer.listwatch.state == EMPTY
        assert (await informer.set_shard(quarters[:2])).relisted, "only narrowed, but the gain's sync is owed"
        await informer.listwatch.sync.replace([], "9", "paged")
        assert not (await informer.set_shard(quarters[:1])).relisted and informer.listwatch.state == WATCHING

    run(scenario())
