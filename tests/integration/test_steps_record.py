"""Steps on the real control plane: the record on the object decides — once per object, once per
generation, give up after N, a delay that survives an operator killed and started again — and a
stale cached copy, older than declop's own record write, does not run a step twice: with this
replica's memory of its writes (no conflict, no write) and without it (the apiserver refuses the
guarded claim)."""

from __future__ import annotations

import json
import logging
import subprocess
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import declop
from declop.handlers.steps import wrap
from declop.manager import Options
from declop.registry.signatures import wanted_names
from declop.testing.cluster.runner import OperatorProcess, OperatorRunner, wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "examples" / "kopf" / "crd.yaml"
RESOURCE = "kopfexamples.kopf.dev"


def kubectl(env: dict[str, str], *args: str, input: str | None = None) -> str:
    result = subprocess.run(["kubectl", *args], env=env, input=input, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
    return result.stdout


@pytest.fixture
def env(control_plane: Any) -> dict[str, str]:
    env = {**control_plane.env(), "PYTHONUNBUFFERED": "1"}
    kubectl(env, "apply", "-f", str(CRD))
    kubectl(env, "wait", "--for=condition=Established", f"crd/{RESOURCE}", "--timeout=30s")
    return env


def create(env: dict[str, str], namespace: str, name: str = "ex", spec: dict[str, Any] | None = None) -> None:
    body = {"apiVersion": "kopf.dev/v1", "kind": "KopfExample", "metadata": {"name": name}, "spec": spec or {"field": "a"}}
    kubectl(env, "create", "-n", namespace, "-f", "-", input=json.dumps(body))


def get(env: dict[str, str], namespace: str, name: str = "ex") -> dict[str, Any]:
    return json.loads(kubectl(env, "get", "-n", namespace, "kopfexample", name, "-o", "json"))  # type: ignore[no-any-return]


def record(env: dict[str, str], namespace: str, controller: str, name: str = "ex") -> dict[str, Any]:
    annotations = get(env, namespace, name)["metadata"].get("annotations") or {}
    return json.loads(annotations.get(f"steps.declop.dev/{controller}") or "{}")  # type: ignore[no-any-return]


def touch(env: dict[str, str], namespace: str, value: str, name: str = "ex") -> None:
    kubectl(env, "annotate", "--overwrite", "-n", namespace, "kopfexample", name, f"touch={value}")


def operator(registry: declop.registry.Registry, kubeconfig: str, namespace: str) -> OperatorRunner:
    return OperatorRunner(registry, kubeconfig=kubeconfig, options=Options(namespaces=(namespace,), grace_period=5))


def idle(op: OperatorRunner) -> bool:
    def check() -> bool:
        return all(not (s.depth or s.processing or s.waiting) for s in (c.queue.statistics() for c in op.manager.controllers))

    return op.call_soon(check)


class Runs:
    def __init__(self) -> None:
        self.items: list[tuple[str, int]] = []
        self.lock = threading.Lock()

    def add(self, step: str, generation: int) -> None:
        with self.lock:
            self.items.append((step, generation))

    def of(self, step: str) -> list[int]:
        with self.lock:
            return [g for s, g in self.items if s == step]


def conflicts(caplog: pytest.LogCaptureFixture) -> int:
    return sum(1 for r in list(caplog.records) if r.getMessage().startswith("Conflict, requeueing"))


def test_once_per_object_and_once_per_generation(env: dict[str, str], kubeconfig: str, namespace: str) -> None:
    registry, runs = declop.registry.Registry(), Runs()

    @registry.reconciler(RESOURCE)
    def gen(obj: Any, steps: declop.Steps) -> None:
        if obj is None:
            return
        g = obj["metadata"]["generation"]
        steps.run("per-object", lambda: runs.add("per-object", g), once="object")
        steps.run("per-generation", lambda: runs.add("per-generation", g))

    with operator(registry, kubeconfig, namespace) as op:
        create(env, namespace)
        wait_for(lambda: record(env, namespace, "gen").get("per-generation", {}).get("done"), 20, what="both steps done")
        touch(env, namespace, "1")  # metadata only: the generation stays 1
        wait_for(lambda: get(env, namespace)["metadata"]["annotations"].get("touch") == "1" and idle(op), 20, what="the touch handled")
        kubectl(env, "patch", "-n", namespace, "kopfexample", "ex", "--type=merge", "-p", '{"spec":{"field":"b"}}')
        wait_for(lambda: record(env, namespace, "gen")["per-generation"]["generation"] == 2
                 and record(env, namespace, "gen")["per-generation"].get("done"), 20, what="generation 2 done")  # fmt: skip
        wait_for(lambda: idle(op), 20, what="the operator idle")
    assert runs.of("per-object") == [1]
    assert runs.of("per-generation") == [1, 2]
    assert record(env, namespace, "gen")["per-object"] == {"generation": 1, "attempts": 1, "done": True}


def test_give_up_after_n_attempts(env: dict[str, str], kubeconfig: str, namespace: str) -> None:
    registry, runs = declop.registry.Registry(), Runs()

    @registry.reconciler(RESOURCE)
    def doomed(obj: Any, steps: declop.Steps) -> None:
        if obj is not None:
            steps.run("call-home", lambda: runs.add("call-home", 0) or 1 / 0, retries=3, backoff=0.2)

    with operator(registry, kubeconfig, namespace) as op:
        create(env, namespace)
        wait_for(lambda: "failed" in record(env, namespace, "doomed").get("call-home", {}), 20, what="the step failed for good")
        touch(env, namespace, "again")  # a wake-up after the failure: nothing more runs
        wait_for(lambda: get(env, namespace)["metadata"]["annotations"].get("touch") == "again" and idle(op), 20, what="idle")
    entry = record(env, namespace, "doomed")["call-home"]
    assert entry["attempts"] == 3 and entry["failed"] == "3 attempts: division by zero"
    assert len(runs.of("call-home")) == 3


def test_a_delay_survives_a_killed_operator(env: dict[str, str], namespace: str) -> None:
    args = [str(Path(__file__).with_name("steps_operator.py")), "-n", namespace]
    first = OperatorProcess(args, env=env)
    first.start()
    try:
        first.wait_for_line("Starting workers")
        create(env, namespace)
        first.wait_for_line("ATTEMPT 1")
        wait_for(lambda: "next" in record(env, namespace, "delayed").get("flaky", {}), 20, what="the next try on record")
    finally:
        first.proc.kill()  # SIGKILL: nothing in memory survives
        first.proc.wait()
    due = datetime.fromisoformat(record(env, namespace, "delayed")["flaky"]["next"].replace("Z", "+00:00")).timestamp()
    with OperatorProcess(args, env=env) as second:
        started = second.wait_for_line("Starting workers") and datetime.now().timestamp()
        assert started < due, "the restart took longer than the delay: nothing was tested"
        second.wait_for_line("ATTEMPT 2", timeout=30)
        second.wait_for_line("DONE")
        at = float(next(line for line in second.lines if line.startswith("ATTEMPT 2")).split()[2])
    assert at >= due - 0.05, f"the second attempt ran {due - at:.2f} s before its recorded time"
    assert not any(line.startswith("ATTEMPT 1") for line in second.lines)
    assert record(env, namespace, "delayed")["flaky"] == {"generation": 1, "attempts": 2, "done": True}


class Feed:
    """A reconciler that runs a steps runner (the one the registry makes, with its own memory of
    its writes) on the object it is given — or, while ``stale`` is set, on that older version of it:
    a cached copy from before declop's own record writes, as a lagging cache would hold it."""

    def __init__(self, controller: str, runs: Runs) -> None:
        def once(steps: declop.Steps) -> None:
            steps.run("create-bucket", lambda: runs.add("create-bucket", 0), once="object")

        self.runner, _ = wrap(once, controller, wanted_names)
        self.stale: dict[str, Any] | None = None
        self.first: dict[str, Any] | None = None
        self.fed = 0
        self.lock = threading.Lock()

    def __call__(self, request, obj, client, logger):  # type: ignore[no-untyped-def]  # (a callable object: its obj annotation would be resolved in no module)
        if obj is None:
            return None
        with self.lock:
            if self.first is None:
                self.first = declop.clone(obj)  # the object before any record was written
            if self.stale is not None:
                obj, self.fed = declop.clone(self.stale), self.fed + 1
        return self.runner(request=request, obj=obj, client=client, logger=logger)


def test_a_stale_copy_after_our_own_write_runs_nothing_and_writes_nothing(
    env: dict[str, str], kubeconfig: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="declop")
    registry, runs = declop.registry.Registry(), Runs()
    feed = Feed("stale", runs)
    registry.reconciler(RESOURCE, name="stale")(feed)
    original_runner = feed.runner

    armed: list[bool] = []

    def first_then_stale(**kwargs: Any) -> Any:
        result = original_runner(**kwargs)
        with feed.lock:  # after the first call, every call gets the copy from before our claim and outcome
            if not armed:
                armed.append(True)
                feed.stale = feed.first
        return result

    feed.runner = first_then_stale
    with operator(registry, kubeconfig, namespace) as op:
        create(env, namespace)
        wait_for(lambda: record(env, namespace, "stale").get("create-bucket", {}).get("done"), 20, what="the step done")
        for i in range(3):  # each wakes the handler, which reads the stale copy
            touch(env, namespace, str(i))
        wait_for(lambda: feed.fed >= 3 and idle(op), 20, what="the stale copy fed three times")
        assert conflicts(caplog) == 0  # decided on our own last write: nothing was sent
        assert record(env, namespace, "stale")["create-bucket"] == {"generation": 1, "attempts": 1, "done": True}
        with feed.lock:
            feed.stale = None
        touch(env, namespace, "fresh")
        wait_for(lambda: idle(op), 20, what="idle")
    assert runs.of("create-bucket") == [0] and conflicts(caplog) == 0


def test_a_stale_copy_on_a_new_replica_is_refused_by_the_guard(
    env: dict[str, str], kubeconfig: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="declop")
    runs = Runs()
    first = Feed("stale", runs)
    registry = declop.registry.Registry()
    registry.reconciler(RESOURCE, name="stale")(first)
    with operator(registry, kubeconfig, namespace) as op:
        create(env, namespace)
        wait_for(lambda: record(env, namespace, "stale").get("create-bucket", {}).get("done"), 20, what="the step done")
        wait_for(lambda: idle(op), 20, what="idle")
    assert runs.of("create-bucket") == [0]

    second = Feed("stale", runs)  # a new process: no memory of the first one's writes
    second.stale = first.first  # and a cache that lags behind them
    registry = declop.registry.Registry()
    registry.reconciler(RESOURCE, name="stale")(second)
    with operator(registry, kubeconfig, namespace) as op:
        wait_for(lambda: conflicts(caplog) >= 2, 30, what="the guarded claim refused (twice)")
        assert runs.of("create-bucket") == [0]  # refused: the step did not run again
        with second.lock:
            second.stale = None  # the cache catches up
        touch(env, namespace, "fresh")
        wait_for(lambda: idle(op), 30, what="idle")
    assert runs.of("create-bucket") == [0]
    assert record(env, namespace, "stale")["create-bucket"] == {"generation": 1, "attempts": 1, "done": True}


def test_the_record_in_the_status(env: dict[str, str], kubeconfig: str, namespace: str) -> None:
    registry, runs = declop.registry.Registry(), Runs()

    @registry.reconciler(RESOURCE)
    def in_status(obj: Any, steps: declop.Steps = "status") -> None:  # type: ignore[assignment]
        if obj is not None:
            steps.run("first", lambda: runs.add("first", 0), once="object")
            steps.run("second", lambda: runs.add("second", 0), retries=2, backoff=0.1)

    def steps_status() -> dict[str, Any]:
        return (get(env, namespace).get("status") or {}).get("steps", {}).get("in_status", {})  # type: ignore[no-any-return]

    with operator(registry, kubeconfig, namespace) as op:
        create(env, namespace)
        wait_for(lambda: steps_status().get("second", {}).get("done"), 20, what="both steps done in the status")
        touch(env, namespace, "1")
        wait_for(lambda: get(env, namespace)["metadata"]["annotations"].get("touch") == "1" and idle(op), 20, what="idle")
    assert runs.of("first") == [0] and runs.of("second") == [0]
    assert steps_status()["first"] == {"generation": 1, "attempts": 1, "done": True}
    assert not any(k.startswith("steps.declop.dev/") for k in get(env, namespace)["metadata"].get("annotations") or {})


def test_an_async_handler_awaits_its_steps(env: dict[str, str], kubeconfig: str, namespace: str) -> None:
    registry, runs = declop.registry.Registry(), Runs()

    @registry.reconciler(RESOURCE)
    async def in_async(obj: Any, steps: declop.Steps) -> None:
        if obj is None:
            return

        async def step() -> None:
            runs.add("async", obj["metadata"]["generation"])

        await steps.arun("async", step)
        await steps.arun("sync-in-async", lambda: runs.add("sync-in-async", 0), once="object")

    with operator(registry, kubeconfig, namespace) as op:
        create(env, namespace)
        wait_for(lambda: record(env, namespace, "in_async").get("sync-in-async", {}).get("done"), 20, what="both steps done")
        touch(env, namespace, "1")
        wait_for(lambda: get(env, namespace)["metadata"]["annotations"].get("touch") == "1" and idle(op), 20, what="idle")
    assert runs.of("async") == [1] and runs.of("sync-in-async") == [0]


def test_two_replicas_at_once_run_a_step_once(
    env: dict[str, str], kubeconfig: str, namespace: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two operators reconciling the same object at the same time (a handover's overlap, or no
    leader election): each reads its own cache and claims; the apiserver takes one claim.

    The loser that reads the winner's claim before its outcome waits, and keeps a retry at the
    claim's expiry as a safety net (the winner's outcome event wakes it sooner, but the delayed
    retry stays queued, as client-go's delaying queue keeps it). The hold is shortened here so
    that retry fires inside the test's wait for idle (with the 60 s default it outlived it: a
    fresh-clone run failed 'both idle'); the step itself takes milliseconds, far under it."""
    monkeypatch.setattr(declop.handlers.steps, "CLAIM_HOLD", 8.0)
    caplog.set_level(logging.INFO, logger="declop")
    runs, met = Runs(), threading.Event()
    inside = threading.Barrier(2, action=met.set, timeout=10)
    registries = []
    for _ in range(2):
        registry = declop.registry.Registry()

        @registry.reconciler(RESOURCE, name="both")
        def both(obj: Any, steps: declop.Steps) -> None:
            if obj is None:
                return
            if not met.is_set():
                inside.wait()  # both first calls are under way, each with its own copy, before either claims
            steps.run("once", lambda: runs.add("once", 0), once="object")

        registries.append(registry)
    with operator(registries[0], kubeconfig, namespace) as a, operator(registries[1], kubeconfig, namespace) as b:
        create(env, namespace)
        wait_for(lambda: record(env, namespace, "both").get("once", {}).get("done"), 20, what="the step done")
        wait_for(lambda: idle(a) and idle(b), 30, what="both idle")
    assert runs.of("once") == [0]
    assert conflicts(caplog) >= 1  # the other replica's claim was refused
