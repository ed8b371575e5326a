"""The simulated world: real managers, informers and controllers of several replicas on virtual
time (declop.testing.simulation.world), and the watch side of the fake apiserver it runs against."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import logging
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from declop.errors import ApiError
from declop.kube import fencing
from declop.leases.leader import LeaderElector
from declop.leases.ranges import ShardSet
from declop.leases.watchdog import Watchdog
from declop.manager import Manager, loss
from declop.testing.simulation import world as simworld
from declop.testing.fakes.apiserver import FakeApiServer
from declop.testing.simulation.leases import Fault
from declop.testing.simulation.world import World, run

NO_FAULTS: tuple[Fault, ...] = ()


def _cm(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "ns"}}


def test_a_watch_replays_the_history_after_its_resource_version_then_goes_live() -> None:
    async def main() -> list[tuple[str, str]]:
        server = FakeApiServer()
        first = server.seed(_cm("a"))
        server.seed(_cm("b"))
        seen: list[tuple[str, str]] = []

        async def watch() -> None:
            async for line in server.watch("/api/v1/namespaces/ns/configmaps", {"resourceVersion": first["metadata"]["resourceVersion"]}):
                event = json.loads(line)
                seen.append((event["type"], event["object"]["metadata"]["name"]))
                if len(seen) == 3:
                    return

        task = asyncio.ensure_future(watch())
        await asyncio.sleep(0)
        await server.request("DELETE", "/api/v1/namespaces/ns/configmaps/a")
        await server.request("POST", "/api/v1/namespaces/ns/configmaps", body=_cm("c"))
        await asyncio.wait_for(task, 1)
        return seen

    assert asyncio.run(main()) == [("ADDED", "b"), ("DELETED", "a"), ("ADDED", "c")]


def test_a_watch_older_than_the_history_ends_with_an_in_stream_410() -> None:
    async def main() -> dict:
        server = FakeApiServer()
        server.seed(_cm("a"))
        server.compact()
        lines = [json.loads(line) async for line in server.watch("/api/v1/namespaces/ns/configmaps", {"resourceVersion": "0"})]
        return lines[-1]

    last = asyncio.run(main())
    assert last["type"] == "ERROR" and last["object"]["code"] == 410


def test_a_streaming_list_ends_its_initial_events_with_the_annotated_bookmark() -> None:
    async def main() -> list[dict]:
        server = FakeApiServer()
        server.seed(_cm("a"))
        out = []
        async for line in server.watch("/api/v1/namespaces/ns/configmaps", {"sendInitialEvents": "true", "allowWatchBookmarks": "true"}):
            out.append(json.loads(line))
            if out[-1]["type"] == "BOOKMARK":
                return out
        return out

    events = asyncio.run(main())
    assert [e["type"] for e in events] == ["ADDED", "BOOKMARK"]
    assert events[-1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


def test_paged_lists_hand_out_continue_tokens_and_expire_them_after_compaction() -> None:
    async def main() -> None:
        server = FakeApiServer()
        for n in "abc":
            server.seed(_cm(n))
        page = await server.request("GET", "/api/v1/namespaces/ns/configmaps", params={"limit": 2})
        assert [o["metadata"]["name"] for o in page["items"]] == ["a", "b"]
        token = page["metadata"]["continue"]
        rest = await server.request("GET", "/api/v1/namespaces/ns/configmaps", params={"limit": 2, "continue": token})
        assert [o["metadata"]["name"] for o in rest["items"]] == ["c"] and "continue" not in rest["metadata"]
        server.seed(_cm("d"))
        server.compact()
        try:
            await server.request("GET", "/api/v1/namespaces/ns/configmaps", params={"limit": 2, "continue": token})
        except Exception as exc:  # noqa: BLE001
            assert getattr(exc, "status", None) == 410
        else:
            raise AssertionError("an expired continue token must be a 410")

    asyncio.run(main())


def test_real_managers_converge_without_faults_in_leader_mode() -> None:
    result = run(World(mode="leader", objects=60, duration=20.0, faults=NO_FAULTS), seed=1)
    assert result.ok, result.report()
    assert result.calls > 60


def test_a_world_run_is_a_pure_function_of_its_seed() -> None:
    world = World(mode="leader", objects=40, duration=20.0, faults=(Fault(5.0, "pause", 0, 20.0), Fault(8.0, "crash", 1, 3.0)))
    a, b = run(world, seed=3), run(world, seed=3)
    assert (a.calls, a.requests, [str(v) for v in a.violations]) == (b.calls, b.requests, [str(v) for v in b.violations])


# defect 5: sharded by uid, a name deleted and created again is two objects in two ranges.
# Found with World(mode="sharded", finalizer=False, strict=True) seed 1: no fault at all, r2 starts
# the new ns-f/w029's call while r0 still runs the old one's deletion (seed 10 since a created
# Lease's fence opens a renew deadline later: r1 starts the new ns-b/w001 at t=28.1 while r2
# runs the old one's; seed 38 since Lease requests wait with asyncio.timeout, defect 17: a call of
# the new ns-e/w036 while r1 runs the old one's, since t=28.0). Decided: the documented
# exception (contract.md §7, sharding.md): the old object's DELETED call may overlap the new
# object's calls; without a finalizer any call of the old object may, with one the cleanup never.
SMALL_SHARDED = World(mode="sharded", objects=60, duration=20.0, faults=NO_FAULTS)


def test_sharded_by_uid_without_a_finalizer_a_deletion_and_a_re_creation_overlap_on_two_replicas() -> None:
    import dataclasses

    # no fault: a name's deletion and its re-creation land in two ranges on two replicas
    strict = run(dataclasses.replace(SMALL_SHARDED, finalizer=False, strict=True), seed=38)
    assert [v.invariant for v in strict.violations][:1] == ["I1"], strict.report()
    assert "ns-e/w036" in strict.violations[0].detail
    assert run(dataclasses.replace(SMALL_SHARDED, finalizer=False), seed=38).ok  # the documented exception


def test_sharded_by_uid_with_a_finalizer_the_deleted_call_overlaps_the_new_object_but_the_cleanup_never_does() -> None:
    # seed 5 (default world, sharded): the old ns-e/w060's DELETED call (after its cleanup)
    # runs while the re-created object's call starts on another replica (t=28.27)
    world = World(mode="sharded", strict=True)
    strict = run(world, seed=5)
    assert strict.violations and strict.violations[0].invariant == "I1", strict.report()
    assert "ns-e/w060" in strict.violations[0].detail
    import dataclasses

    assert run(dataclasses.replace(world, strict=False), seed=5).ok  # DELETED calls excused, cleanups not


# declop sim: a user's handlers module in the simulated world


def _sim(*args: str) -> "object":
    from click.testing import CliRunner

    from declop import cli
    from declop.loader import unload
    from declop.registry import default_registry

    # the loader registers into the default registry: run on an empty one, then put back what
    # other tests' imports registered there (examples/test_widget_unit.py's handlers)
    fields = ("_registrations", "_indexes", "_transforms", "_hooks", "_webhooks", "_frozen")
    saved = {f: copy.copy(getattr(default_registry, f)) for f in fields}  # clear() empties them in place
    default_registry.clear()
    logger = logging.getLogger("declop")
    level = logger.level  # declop sim silences declop's log (the faults make errors on purpose)
    try:
        return CliRunner().invoke(cli.cli, ["sim", *args], catch_exceptions=False)
    finally:
        logger.setLevel(level)
        unload()  # the next load executes the handler file afresh
        for f, v in saved.items():
            setattr(default_registry, f, v)


def test_declop_sim_runs_the_pods_example_and_prints_the_rate() -> None:
    result = _sim("examples/pods.py", "--seeds", "2", "--objects", "30", "--duration", "15")
    assert result.exit_code == 0, result.output  # type: ignore[attr-defined]
    assert "2 seeds, 0 failed" in result.output and "schedules/s" in result.output  # type: ignore[attr-defined]


def test_declop_sim_runs_the_crd_example_sharded_with_its_typed_model() -> None:
    result = _sim("examples/crd/handlers.py", "--mode", "sharded", "--seeds", "2", "--objects", "30", "--duration", "15")
    assert result.exit_code == 0, result.output  # type: ignore[attr-defined]
    assert "2 seeds, 0 failed" in result.output  # type: ignore[attr-defined]


def test_a_name_deleted_and_created_again_under_a_pause_is_reconciled_despite_generation_changed() -> None:
    """Seed 193 of the CRD example (whose controller filters with generation_changed): the leader's
    watch misses a delete + create of ns-b/w041, its relist reports the new object as an update at
    the same generation 1, and the predicate dropped it — I3, never reconciled. An update whose
    uid changed now passes every *_changed predicate."""
    result = _sim("examples/crd/handlers.py", "--seed", "193")
    assert result.exit_code == 0, result.output  # type: ignore[attr-defined]
    assert result.output.startswith("ok declop sim examples/crd/handlers.py --seed 193")  # type: ignore[attr-defined]


def test_declop_sim_one_seed_prints_its_repro_line_and_faults() -> None:
    result = _sim("examples/pods.py", "--seed", "1", "--objects", "30", "--duration", "15")
    assert result.exit_code == 0, result.output  # type: ignore[attr-defined]
    assert result.output.startswith("ok declop sim examples/pods.py --seed 1 --objects 30 --duration 15")  # type: ignore[attr-defined]
    assert "faults:" in result.output  # type: ignore[attr-defined]


def test_declop_sim_takes_the_project_s_objects_from_a_function(tmp_path: Any) -> None:
    gen = tmp_path / "bodies.py"
    gen.write_text("def widget(rng, index):\n    return {'spec': {'replicas': rng.randint(0, 2), 'message': f'm{index}'}}\n"
                   "def wrong(rng, index):\n    return ['spec']\n")  # fmt: skip
    result = _sim("examples/crd/handlers.py", "--seed", "2", "--objects", "20", "--duration", "10", "--objects-from", f"{gen}:widget")
    assert result.exit_code == 0, result.output  # type: ignore[attr-defined]
    assert f"--objects-from {gen}:widget" in result.output.splitlines()[0]  # type: ignore[attr-defined]
    from declop.errors import ConfigError

    with pytest.raises(ConfigError, match=f"^--objects-from {gen}:wrong gave list for object 0; return the object's body"):
        _sim("examples/crd/handlers.py", "--seed", "2", "--objects", "20", "--objects-from", f"{gen}:wrong")


def test_declop_sim_without_handlers_is_one_line() -> None:
    from click.testing import CliRunner

    from declop import cli

    result = CliRunner().invoke(cli.cli, ["sim"])
    assert result.exit_code != 0 and "nothing to simulate" in str(result.exception)


# defect 3: without a finalizer, a deletion made while its range has no owner is lost (documented)


def test_without_a_finalizer_a_deletion_while_the_range_has_no_owner_reaches_no_handler() -> None:
    from declop.testing.simulation.world import World

    world = World(mode="sharded", shard_by="namespace", finalizer=False)
    # seed 29 since Lease requests wait with asyncio.timeout (defect 17; seed 35 before)
    strict = run(dataclasses.replace(world, strict=True), seed=29)
    assert [v.invariant for v in strict.violations][:1] == ["I4"], strict.report()
    assert "ns-g/w190" in strict.violations[0].detail
    assert run(world, seed=29).ok  # the documented exception: no owner when it was deleted


def test_with_a_finalizer_the_same_schedule_loses_no_deletion() -> None:
    from declop.testing.simulation.world import World

    result = run(World(mode="sharded", shard_by="namespace"), seed=29)
    assert result.ok, result.report()


def test_a_range_lost_and_retaken_delivers_the_deletions_it_dropped_at_its_fence(monkeypatch: pytest.MonkeyPatch) -> None:
    # defect 3, the part declop can fix. Seed 18 (sharded by uid, no finalizer; seed 307 before a
    # created Lease's fence opened a renew deadline later): r2 is black-holed from t=39.7 for
    # 8.3 s and loses range 0; the deletion of ns-d/w059 (t=47.4) reaches it once the partition
    # heals, is dropped at its fence, and r2 takes the range back — listing it, the object is
    # gone. Without the tombstones (checked below) that deletion never reaches a handler.
    from declop.reconcile._keys import ShardBook

    world = World(mode="sharded", finalizer=False)
    result = run(world, seed=18)
    assert result.ok, result.report()
    real = ShardBook.refused

    def forgetful(book: Any, key: Any, index: Any, cached: bool) -> None:
        real(book, key, index, cached)
        book.tombstones.clear()

    monkeypatch.setattr(ShardBook, "refused", forgetful)
    without = run(world, seed=18)
    assert [v.invariant for v in without.violations][:1] == ["I4"], without.report()
    # (ns-c/w026's too since 1a45be5, where a gone object's key keeps its range while a cause of
    # it waits: that key now reaches the fence with a range, and so depends on the tombstones)
    assert any("ns-d/w059" in v.detail for v in without.violations), without.report()


def test_i2_holds_a_call_to_the_apiservers_record_of_its_lease(monkeypatch: "object") -> None:
    world = World(mode="sharded", objects=30, duration=10.0, faults=NO_FAULTS)
    assert run(world, seed=1).ok
    serve = simworld._World.serve

    async def foreign(self: "simworld._World", *args: "object") -> "object":  # every record names someone else
        out = await serve(self, *args)  # type: ignore[arg-type]
        for name in list(self.leases):
            self.leases[name] = ("someone-else", 0.0, 1e9)
        return out

    monkeypatch.setattr(simworld._World, "serve", foreign)  # type: ignore[attr-defined]
    result = run(world, seed=1)
    # the calls (I2) and their fenced writes (I9) are held to the record, each by its own check
    assert {"I2", "I9"} <= {v.invariant for v in result.violations}, result.report()


def test_the_fake_apiserver_serves_shard_selectors_when_asked() -> None:
    from declop.leases.hashing import ShardFilter, split

    async def main() -> None:
        server = FakeApiServer()
        # 64 objects: uids are random, and with 8 all of them fell in one half in one CI run
        # (1 in 128); with 64, 1 in 2^63
        for i in range(64):
            server.seed(_cm(f"cm-{i}"))
        half = ShardFilter("uid", (split(2)[0],))
        params = {"shardSelector": half.selector}
        everything = await server.request("GET", "/api/v1/namespaces/ns/configmaps", params=params)
        assert len(everything["items"]) == 64 and "shardInfo" not in everything["metadata"]  # the gate off
        server.shard_selectors = True
        page = await server.request("GET", "/api/v1/namespaces/ns/configmaps", params=params)
        assert page["metadata"]["shardInfo"] == {"selector": half.selector}
        assert page["items"] and all(half.matches(o) for o in page["items"]) and len(page["items"]) < 64

    asyncio.run(main())


def test_sharded_managers_converge_with_server_side_shard_filtering() -> None:
    result = run(World(mode="sharded", objects=60, duration=20.0, server_filter=True), seed=2)
    assert result.ok, result.report()


# -- daemons (I9) ---------------------------------------------------------------------------------
# The partition comes after the ranges settled (about 28 virtual seconds in) and outlasts the Leases.
DAEMON_HANG = (Fault(35.0, "hang", 0, 25.0),)


@pytest.mark.parametrize("mode", ["leader", "sharded"])
def test_no_two_daemons_of_one_object_run_at_once_under_a_partition(mode: str) -> None:
    from declop.testing.simulation.world import builtin_registry

    world = World(mode=mode, daemons=True, objects=40, duration=60.0, faults=DAEMON_HANG)
    registry = builtin_registry(world)
    (daemon,) = [r for r in registry.registrations if r.name == "widget_daemon"]
    result = run(world, seed=1, registry=registry)
    assert result.ok, result.report()
    assert daemon.fn.__self__.starts >= 40  # type: ignore[attr-defined]  # every object's, and again after failover


def test_i9_sees_daemons_that_outlive_their_range(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check has teeth: a daemon that neither counts in flight in its range nor hears of its
    loss (no fence scope) keeps running on the partitioned replica while the next owner starts it."""
    import declop.handlers.daemons as daemons

    class NoScope:
        current = staticmethod(lambda: None)
        enter = staticmethod(daemons.fencing.enter)

    monkeypatch.setattr(daemons, "fencing", NoScope)
    result = run(World(mode="sharded", daemons=True, objects=40, duration=60.0, faults=DAEMON_HANG), seed=0)
    assert any(v.invariant == "I9" for v in result.violations), result.report()


def test_daemon_worlds_pass_over_generated_schedules() -> None:
    for mode in ("leader", "sharded"):
        for seed in (3, 4):
            result = run(World(mode=mode, daemons=True, objects=30, duration=40.0), seed=seed)
            assert result.ok, result.report()


def test_leader_mode_a_deletion_only_standbys_saw_is_the_documented_exception_when_a_restarted_replica_leads() -> None:
    """Seed 693 of examples/buggy/idempotence_fixed.py (its handler, inline): the leader r0 finds
    no renewal for 10 s under a ``fail`` fault, exits and restarts; ``ns-c/w162`` is deleted at
    t=37.159 meanwhile, and r0#2 — which listed after the object went — leads to the end. The
    standbys queued the deletion but never led. Without a finalizer that deletion is lost
    (contract.md §7); I4 held it against declop in leader mode ("any next leader delivers it")."""
    import declop
    from declop.registry import Registry

    registry = Registry()

    @registry.reconciler("configmaps", owns=["secrets"])
    def make_child(request: Any, client: Any, obj: Any) -> None:
        if obj is None:
            return
        name = f"{request.name}-child"
        try:
            client.get("secrets", name)
            return
        except declop.NotFound:
            pass
        child = {"metadata": {"name": name, "namespace": request.namespace}}
        declop.set_controller_reference(child, obj)
        try:
            client.create("secrets", child)
        except declop.Conflict:
            pass

    world = World(handlers="idempotence_fixed.py")
    strict = run(dataclasses.replace(world, strict=True), 693, registry)
    assert [str(v) for v in strict.violations][:1] == ["t=135.476 I4 -: the deletion of ns-c/w162 (uid 2a54ac1a) at t=37.159 never reached a handler"]
    assert run(world, 693, registry).ok


# the idempotence check: reconciles that never ran by its deadline fail it (they ended "time" silently)

STUCK = '''
import asyncio
import declop


@declop.reconciler("configmaps", max_concurrent=4)
async def stuck(request, client, obj, **_):
    if obj is not None and request.name == "w003" and (obj["metadata"].get("annotations") or {}).get("sim.declop.dev/value"):
        await asyncio.Event().wait()  # never returns once the workload updated the object
'''


def test_a_check_reconcile_that_never_runs_fails_idempotence_naming_the_object_and_its_running_call(tmp_path: Any) -> None:
    from declop.testing import simulate

    handlers = tmp_path / "stuck.py"
    handlers.write_text(STUCK)
    (failed,) = simulate(str(handlers), seeds=1, start=1, objects=20, duration=20.0).failed  # seed 1 updates w003
    (violation,) = failed.violations
    assert failed.ended == "time" and violation.invariant == "idempotence" and violation.handler == "stuck"
    assert "one more reconcile of 1 object(s), queued at t=" in violation.detail
    assert "did not run within 32.000 virtual s: ns-d/w003 by stuck (a call started at t=" in violation.detail
    assert "still runs) — so their idempotence is unknown" in violation.detail and "bound every wait with a timeout" in violation.detail
    assert failed.history[0].startswith("the history of ns-d/w003 (")


# -- the search over world schedules: real managers under every fault kind, the placed ones too --

#: every kind a world run can draw: the uniform ones and the protocol's (pause between a fenced
#: write's check and its send, SIGTERM with a grace that may run out, an admin Lease delete)
EVERY_KIND = tuple(k for k in simworld.WORLD_KINDS if k != simworld.CRASH_BETWEEN_WRITES)
SWEEP_WORLD = dict(objects=40, duration=40.0, kinds=EVERY_KIND)


#: the sweep's handler shapes by first seed, 50 seeds a chunk: the built-in ``async def`` on the
#: priority queue (seeds 0-199), a plain ``def`` (its calls in batches on the executor), a FIFO
#: queue (the plain WorkQueue), both, and a leader-only background task beside the default (I14)
SWEEP_SHAPES: dict[int, dict[str, bool]] = {
    0: {}, 50: {}, 100: {}, 150: {}, 200: {"plain": True}, 250: {"fifo": True}, 300: {"plain": True, "fifo": True},
    350: {"background": True},
}


_NEVER_RETRIEVED = """
import gc, logging
from declop import collector
from declop.testing.simulation.world import WORLD_KINDS, CRASH_BETWEEN_WRITES, World, run
said = []
class Said(logging.Handler):
    def emit(self, record):
        said.append(record.getMessage().splitlines()[0])
logging.getLogger("asyncio").addHandler(Said())
logging.getLogger().addHandler(logging.NullHandler())  # the replicas' own lines stay quiet
kinds = tuple(k for k in WORLD_KINDS if k != CRASH_BETWEEN_WRITES)
result = run(World(mode="leader", objects=40, duration=40.0, kinds=kinds), seed=6)
collector.thaw()  # the replicas' syncs froze their graphs: only a thawed heap is collected
gc.collect()
print(result.ok, "unsynced" in [f.kind for f in result.faults], said)
"""


def test_a_replica_stopped_before_its_caches_synced_leaves_no_future_never_retrieved() -> None:
    """Leader seed 6: a replica whose caches never sync (``unsynced``) is stopped while its
    controller waits on the sync gates. The wait's gather used to end after the wait was
    cancelled, unretrieved, and the collector printed "_GatheringFuture exception was never
    retrieved" with a traceback: on stderr, outside the structured log (three in 20 seeds).
    In a process of its own: pytest's captured log records hold tracebacks, and with them the
    frames that keep the gather alive past the test."""
    done = subprocess.run([sys.executable, "-c", _NEVER_RETRIEVED], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(" ", 2) == ["True", "True", "[]\n"], done.stdout + done.stderr[-2000:]


@pytest.mark.parametrize(("mode", "start"), [(m, s) for m in ("leader", "sharded") for s in SWEEP_SHAPES])
def test_random_world_schedules_keep_every_invariant(mode: str, start: int) -> None:
    """`make test`'s sweep of world schedules: 400 seeds of each mode (see docs/simulation.md)."""
    world = World(mode=mode, **SWEEP_WORLD, **SWEEP_SHAPES[start])
    for seed in range(start, start + 50):
        result = run(world, seed=seed)
        assert result.ok, result.report()


@pytest.mark.parametrize(("mode", "seed"), [("leader", 13), ("sharded", 0)])
def test_a_write_paused_between_its_check_and_its_send_is_refused_at_the_pool(
    monkeypatch: pytest.MonkeyPatch, mode: str, seed: int
) -> None:
    """pause-at-write: the replica stops after the Transport's fence check, its Lease is taken
    meanwhile; on SIGCONT the pool's check refuses the write. Without the check (a fence that
    never refuses) the same seed's write lands under another holder's record: I9."""
    world = World(mode=mode, objects=40, duration=40.0, kinds=("pause-at-write",))
    assert run(world, seed=seed).ok
    monkeypatch.setattr(fencing.WriteFence, "check", lambda self, method, path: None)
    result = run(world, seed=seed)
    assert [v.invariant for v in result.violations][:1] == ["I9"], result.report()
    assert "accepted under Lease" in str(result.violations[0])


def _without_shutdown_s_lose(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: the stop leaves a Lease to expire under a running call without declaring the loss."""
    real = Manager.lose

    def lose(self: Manager) -> None:
        if sys._getframe(1).f_code.co_name != "shutdown":
            real(self)

    monkeypatch.setattr(Manager, "lose", lose)


@pytest.mark.parametrize(("mode", "seed"), [("leader", 0), ("sharded", 0)])
def test_a_stop_that_leaves_its_lease_to_expire_under_a_call_must_declare_the_loss(
    monkeypatch: pytest.MonkeyPatch, mode: str, seed: int
) -> None:
    """term-in-call: SIGTERM half a second into a call that runs on; the drain ends with the
    call running, so the stop leaves the Lease to expire — a loss, gone within the exit bound
    (the watchdog). Without declaring it, a stop step that waits (closing connections under a
    partition) keeps the process, and its call, alive when a standby takes the Lease: I5."""
    world = World(mode=mode, objects=40, duration=40.0, kinds=("term-in-call",))
    assert run(world, seed=seed).ok
    _without_shutdown_s_lose(monkeypatch)
    result = run(world, seed=seed)
    assert "I5" in {v.invariant for v in result.violations}, result.report()


def test_i11_a_replica_must_be_gone_within_the_exit_bound_after_a_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seed 0: the stop declares the loss, then closing the connections hangs under the
    partition. The manager's own budget ends it in time; with a longer budget only the watchdog
    does — and without the watchdog, I11 names the replica still running after the bound."""
    world = World(mode="leader", objects=40, duration=40.0, kinds=("term-in-call",))
    monkeypatch.setattr(loss, "LOST_CLEANUP_SECONDS", 10.0)
    assert run(world, seed=0).ok
    monkeypatch.setattr(Watchdog, "arm", lambda self: None)
    result = run(world, seed=0)
    assert [v.invariant for v in result.violations][:1] == ["I11"], result.report()


def test_a_replica_resumed_after_its_range_went_elsewhere_under_a_call_must_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seed 52 (sharded, pause): r1 is stopped inside a call of ns-e/w004; its range goes to
    another replica; on SIGCONT the call ends before the renewal round sees the lapse. That
    was a loss under a running call: the replica must be gone within a round and the exit
    bound. Without ``ShardSet.overran`` (the call's end forgets it ran past the Lease) the
    replica rejoins — I5, no longer exempt because it was paused."""
    world = World(mode="sharded", objects=40, duration=40.0, kinds=("pause", "pause-holder"))
    assert run(world, seed=52).ok

    def end(self: ShardSet, index: int) -> None:
        self.in_flight[index] -= 1
        if self.in_flight[index] <= 0:
            del self.in_flight[index]

    monkeypatch.setattr(ShardSet, "end", end)
    result = run(world, seed=52)
    assert [v.invariant for v in result.violations][:1] == ["I5"], result.report()
    assert "after it resumed" in str(result.violations[0])


def test_a_stop_whose_drain_bound_fires_after_a_pause_keeps_the_lease_of_a_running_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Leader seed 4384 of `make sim` (every kind): r0 gets SIGTERM inside a call that runs on,
    then is paused during its drain; on SIGCONT the manager's bound on the drain and the
    controller's grace are due at once, and the bound cancelled ``Controller.stop`` before it
    counted the worker it gave up on — the Lease was released under the running call (I6).
    With the stop as it was (its bookkeeping after the settle wait), I6 again."""
    from declop.reconcile.controller import Controller

    world = World(mode="leader", **SWEEP_WORLD)
    assert run(world, seed=4384).ok

    async def stop(self: Controller, grace: float = 30.0, settle: float = 0.1) -> bool:
        self.halt()
        crew = self.crew
        if not crew.tasks:
            return True
        _, pending = await asyncio.wait(crew.tasks, timeout=grace)
        for task in pending:
            task.cancel()
        crew.tasks = []
        if pending:
            await asyncio.wait(pending, timeout=max(settle, 0.001))
            crew.cancelled = [t for t in pending if not t.done()]
        return not pending

    monkeypatch.setattr(Controller, "stop", stop)
    result = run(world, seed=4384)
    assert "I6" in {v.invariant for v in result.violations}, result.report()


def test_a_stuck_call_that_comes_late_runs_on_only_to_the_fault_s_planned_end() -> None:
    """Sharded seed 4041 of `make sim` (every kind): ``stuck`` was drawn at 5.6 s for 42.5 s, but
    r2's next call — the cleanup of a deleted object — came only at 67.4 s and ran on to 109.9 s,
    while the end checks count from the faults' planned end (48 s): I4 named a deletion the
    fault itself held. The call now runs on to the planned end at most (none, here)."""
    world = World(mode="sharded", **SWEEP_WORLD)
    result = run(world, seed=4041)
    assert result.ok, result.report()


def test_make_sim_draws_every_kind_the_world_sweep_draws() -> None:
    makefile = (Path(__file__).resolve().parents[4] / "Makefile").read_text()
    line = next(x for x in makefile.splitlines() if x.startswith("SIM_WORLD_FAULTS :="))
    assert tuple(line.split(":=", 1)[1].strip().split(",")) == EVERY_KIND
    shapes = next(x for x in makefile.splitlines() if x.startswith("SIM_WORLD_SHAPES ?="))
    assert shapes.split("?=", 1)[1].split() == ["default", "plain-fifo", "background"]  # the sweep's first, plain+FIFO and last shapes
    assert 'plain-fifo) flags="--plain --fifo"' in makefile and 'background) flags="--background"' in makefile


@pytest.mark.parametrize(("mode", "seed"), [("leader", 58), ("sharded", 58)])
def test_a_call_whose_fence_is_never_set_has_its_late_write_caught(monkeypatch: pytest.MonkeyPatch, mode: str, seed: int) -> None:
    """The mutant `make mutate` found the sweep blind to: fencing.enter sets nothing, so no
    write is ever checked. I9 holds every write of a call to the Lease its key falls under,
    fence or none, and pause-at-write pauses such a write too."""
    world = World(mode=mode, **SWEEP_WORLD)
    assert run(world, seed=seed).ok
    monkeypatch.setattr(fencing, "_CURRENT", SimpleNamespace(set=lambda fence: None, reset=lambda token: None, get=lambda: None))
    result = run(world, seed=seed)
    assert [v.invariant for v in result.violations][:1] == ["I9"], result.report()
    assert "sent without a fence" in str(result.violations[0])


# -- clocks that disagree, timings that differ, partitions placed by the protocol --


def _judging_by_its_own_lease_duration(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: a candidate judges another's record by its own lease duration, not the
    record's ``leaseDurationSeconds`` (what it reads is rewritten to its own)."""
    real = LeaderElector._request

    async def request(self: LeaderElector, method: str, path: str, body: Any = None, deadline: float | None = None) -> Any:
        answer = await real(self, method, path, body, deadline)
        if method == "GET" and isinstance(answer, dict) and answer.get("spec"):
            answer = copy.deepcopy(answer)
            answer["spec"]["leaseDurationSeconds"] = self.lease_duration
        return answer

    monkeypatch.setattr(LeaderElector, "_request", request)


def test_a_takeover_that_ignores_the_record_s_lease_duration_fails_under_a_rollout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seed 179: a rollout halves the Lease timings; while both run, the holder is cut off right
    after a renewal. A new replica that waited only its own, shorter, duration would take the
    Lease while the old holder's fence is still open and its call still runs: I5."""
    world = World(mode="leader", objects=40, duration=40.0, kinds=("rollout",))
    result = run(world, seed=179)
    assert result.ok, result.report()
    assert [(f.kind, f.length) for f in result.faults] == [("rollout", 0.5)]
    _judging_by_its_own_lease_duration(monkeypatch)
    result = run(world, seed=179)
    assert "I5" in {v.invariant for v in result.violations}, result.report()


def test_a_lease_measured_on_the_wall_clock_is_taken_early_when_a_clock_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seed 237: a node's wall clock steps (here forward, by 220 s) and the leader is cut off
    right after a renewal. On the Lease clock (monotonic) nothing changes; measured on the wall
    clock, a standby's wait for the record to expire, or the holder's fence, is off by the
    step, and the Lease goes to a standby while the holder's call runs: I5."""
    world = World(mode="leader", objects=40, duration=40.0, kinds=("wall-jump", "partition-holder"))
    result = run(world, seed=237)
    assert result.ok, result.report()
    assert any(f.kind == "wall-jump" for f in result.faults)
    real = LeaderElector.__init__

    def init(self: LeaderElector, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        self.clock = self.wall_clock

    monkeypatch.setattr(LeaderElector, "__init__", init)
    result = run(world, seed=237)
    assert "I5" in {v.invariant for v in result.violations}, result.report()


@pytest.mark.parametrize("mode", ["leader", "sharded"])
def test_clocks_that_run_at_different_rates_keep_every_invariant(mode: str) -> None:
    """Every node's Lease clock runs at its own rate (within DRIFT) from its own origin, and its
    wall clock is skewed and drifts too: the Lease protocol compares no two clocks, and holds."""
    world = World(mode=mode, objects=40, duration=40.0, kinds=("clocks", "partition-holder", "pause", "hang"))
    for seed in range(10):
        result = run(world, seed=seed)
        assert result.ok, result.report()


def test_a_node_s_clocks_are_its_own_and_its_sleeps_run_on_them() -> None:
    """``clocks``: the rates are drawn per node within DRIFT, from a stream of their own (the
    schedule is the one the same kinds draw without it), and a replica's sleep of d seconds takes
    d / rate of true time."""
    loop = simworld.WorldLoop()
    w = simworld._World(World(kinds=("clocks",)), 3, loop, simworld.builtin_registry(World()))
    try:
        rates = [r.rate for r in w.replicas]
        assert len(set(rates)) == len(rates) and all(abs(x - 1.0) <= simworld.DRIFT for x in rates)
        r = w.replicas[0]
        clock = w.lease_clock(r)
        a = simworld.Actor(loop, "r0")

        async def sleep() -> float:
            before = loop.time()
            await asyncio.sleep(10.0)
            return loop.time() - before

        took = loop.run_until_complete(a.spawn(sleep()))
        assert took == pytest.approx(10.0 / r.rate)
        assert clock() == pytest.approx(r.origin + r.rate * loop.time())
    finally:
        loop.close()
    plain = World(kinds=("hang", "pause"))
    skewed = dataclasses.replace(plain, kinds=("hang", "pause", "clocks"))
    assert simworld.schedule(plain, random.Random(5)) == simworld.schedule(skewed, random.Random(5))


def test_a_renewal_answered_with_a_server_error_is_not_a_renewal(monkeypatch: pytest.MonkeyPatch) -> None:
    """``errors``: the leader's requests get 429, 503 and 500-after-commit answers. A 5xx to a
    renewal says nothing of whether the record moved; counted as a renewal, the fence stays
    open past the record's expiry and seed 13 starts a call under another's record: I2."""
    world = World(mode="leader", objects=40, duration=40.0, kinds=("errors",))
    result = run(world, seed=13)
    assert result.ok, result.report()
    real = LeaderElector.try_acquire_or_renew

    async def counted(self: LeaderElector, deadline: float | None = None) -> bool:
        started = self.clock()
        try:
            return await real(self, deadline)
        except ApiError as exc:
            if self.is_leader and exc.status >= 500:
                self.renewed_at = started
            raise

    monkeypatch.setattr(LeaderElector, "try_acquire_or_renew", counted)
    result = run(world, seed=13)
    assert {v.invariant for v in result.violations} & {"I2", "I9"}, result.report()


def test_a_fence_open_past_the_record_s_expiry_fails_when_the_holder_is_stopped_after_a_renewal(monkeypatch: pytest.MonkeyPatch) -> None:
    """pause-holder: SIGSTOP right after the leader's renewal, across its renew deadline and the
    record's expiry. On SIGCONT its call's write comes before the renewal loop notices the
    loss; only the fence (a renew deadline from the renewal's send) stops it. A fence kept open
    6 s longer lets seed 27's write land under the expired record: I9. (Drawn uniformly, a
    pause almost never lands there, and the renewal loop's loss hid the same mutant.)"""
    world = World(mode="leader", objects=40, duration=40.0, kinds=("pause-holder",))
    result = run(world, seed=27)
    assert result.ok, result.report()
    real = LeaderElector.valid

    def valid(self: LeaderElector) -> bool:
        at = self.renewed_at
        return real(self) or (self.is_leader and at is not None and self.clock() < at + self.renew_deadline + 6)

    monkeypatch.setattr(LeaderElector, "valid", valid)
    result = run(world, seed=27)
    assert [v.invariant for v in result.violations][:1] == ["I9"], result.report()


def test_i12_a_manager_whose_run_raises_fails_the_world(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stop path that raises (a `make mutate` mutant: ``grace & 2.0`` in shutdown's drain) was
    invisible: the replica's task ended with the exception and the others took over. `declop run`
    would exit with a traceback instead of its stop; I12 names it, at the first SIGTERM."""
    world = World(mode="leader", objects=40, duration=40.0, kinds=("term",))
    assert run(world, seed=0).ok

    async def broken(self: Manager) -> bool:
        raise TypeError("planted: the stop path raises")

    monkeypatch.setattr(Manager, "shutdown", broken)
    result = run(world, seed=0)
    assert "I12" in {v.invariant for v in result.violations}, result.report()
    assert "planted" in next(str(v) for v in result.violations if v.invariant == "I12")


def test_a_world_run_s_graph_is_freed_once_the_process_thaws(monkeypatch):
    """Each replica's syncs freeze what is alive (declop.collector), the run's managers and loop
    among it: without a thaw every seed's graph stayed for good (7 GB a process in make sim's
    10,000-seed sweep). A run that ends on a multiple of THAW_EVERY thaws, and a pass frees them."""
    import gc
    import weakref

    loops: list[weakref.ref] = []

    class Tracked(simworld.WorldLoop):
        def __init__(self) -> None:
            super().__init__()
            loops.append(weakref.ref(self))

    monkeypatch.setattr(simworld, "WorldLoop", Tracked)
    monkeypatch.setattr(simworld, "THAW_EVERY", 1)
    declop_logger = logging.getLogger("declop")
    level = declop_logger.level
    declop_logger.setLevel(logging.CRITICAL + 1)  # as the CLI runs: pytest's captured records would hold tracebacks
    try:
        result = run(World(mode="leader", objects=6, duration=6, kinds=()), 3)
        assert result.ok, result.report()
        gc.collect()
        assert [r for r in loops if r() is not None] == []
    finally:
        declop_logger.setLevel(level)
        gc.unfreeze()


# -- the plain handler: batches on the executor, each job a greenlet that runs its calls over time --


def test_defect_14_a_plain_handler_s_stall_watch_does_not_spin_at_one_instant() -> None:
    """World(plain=True), no fault: the stall watch's timer fired a rounding error before
    STALL_AFTER on the virtual clock and re-armed itself at the same instant for ever; the run hit
    its step bound after three calls (quiescence). Fixed in declop/reconcile/_run.py (watch)."""
    result = run(World(mode="leader", objects=40, duration=40.0, kinds=(), plain=True), seed=3)
    assert result.ok, result.report()
    assert result.ended == "end" and result.calls > 80


def test_a_plain_world_s_slow_calls_give_the_keys_behind_them_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each executor job runs its calls one after another over virtual time, so a call slower
    than STALL_AFTER stalls its batch and the keys not started go back to the queue, as beside a
    thread; the run is still a function of its seed."""
    from declop.queue.priority import PriorityQueue

    given: list[Any] = []
    give_back = PriorityQueue.give_back
    monkeypatch.setattr(PriorityQueue, "give_back", lambda self, *keys: (given.extend(keys), give_back(self, *keys))[1])
    world = World(mode="sharded", objects=40, duration=40.0, kinds=("pause", "crash"), plain=True)
    first = run(world, seed=5)
    assert first.ok, first.report()
    assert given  # stalls happened: keys went back to the queue
    again = run(world, seed=5)
    assert (again.calls, again.requests, again.steps) == (first.calls, first.requests, first.steps)
