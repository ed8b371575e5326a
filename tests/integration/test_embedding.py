"""declop.Operator against a real kube-apiserver: the manager embedded in an application, run
from a thread and from an existing event loop, each reconciling an object and stopping cleanly;
a second start after a stop; a lost Lease raised to the host as LeaseLost, the process alive."""

from __future__ import annotations

import asyncio
import gc
import signal
import threading
import weakref
from pathlib import Path

import kubernetes.client
import pytest

import declop
from declop import collector
from declop.errors import ConfigError
from declop.manager import LeaseLost, Options
from declop.testing.cluster.faults import TcpProxy
from declop.testing.cluster.runner import wait_for


def _handlers(seen: list[str]) -> declop.registry.Registry:
    registry = declop.registry.Registry()

    @registry.reconciler("configmaps")
    def record(name, **_):
        seen.append(name)

    return registry


def _operator_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "declop-operator"]


def test_from_a_thread_reconciles_stops_cleanly_and_starts_again(kubeconfig, k8s_api, namespace):
    core = kubernetes.client.CoreV1Api(k8s_api)
    seen: list[str] = []
    handlers = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    op = declop.Operator(_handlers(seen), kubeconfig=kubeconfig, options=Options(namespaces=(namespace,), grace_period=5))
    with op:
        assert op.ready() and op.running
        core.create_namespaced_config_map(namespace, {"metadata": {"name": "first"}})
        wait_for(lambda: "first" in seen, 10, what="the first ConfigMap reconciled")
        with pytest.raises(RuntimeError, match="already runs"):
            op.start()
    assert not op.running and not op.ready() and op.exit_code == 0
    assert _operator_threads() == []
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == handlers  # the host's own

    op.start()  # a fresh manager, the same registry
    try:
        core.create_namespaced_config_map(namespace, {"metadata": {"name": "second"}})
        wait_for(lambda: "second" in seen, 10, what="the second run reconciling")
    finally:
        op.stop()
    assert _operator_threads() == [] and not op.running


def test_a_stopped_operator_s_manager_is_freed_not_kept_frozen(kubeconfig, k8s_api, namespace, monkeypatch):
    """An application (or a test suite) that runs operators in turn: each run's syncs freeze
    what is alive, the manager's graph among it, and a frozen cycle is never collected. The
    last manager to stop thaws, so each stopped run is freed (measured before: some 1,000 frozen
    objects and 0.9 MB more per run with a 300-object cache, for as long as the process lived)."""
    monkeypatch.setattr(collector, "_running", 0)  # a world run earlier in this process holds one
    core = kubernetes.client.CoreV1Api(k8s_api)
    for i in range(20):
        core.create_namespaced_config_map(namespace, {"metadata": {"name": f"c{i}"}})
    seen: list[str] = []
    op = declop.Operator(_handlers(seen), kubeconfig=kubeconfig, options=Options(namespaces=(namespace,), grace_period=5))
    runs = []
    for _ in range(3):
        with op:
            wait_for(lambda: len(set(seen)) >= 20, 10, what="the ConfigMaps reconciled")
            runs.append(weakref.ref(op.manager))
        assert gc.get_freeze_count() == 0, "no manager runs: nothing stays frozen on their account"
    gc.collect()
    assert [run() is None for run in runs[:-1]] == [True, True], "a stopped run's manager is still alive"


def test_from_an_existing_event_loop_reconciles_and_stops_cleanly(kubeconfig, k8s_api, namespace):
    core = kubernetes.client.CoreV1Api(k8s_api)
    seen: list[str] = []
    op = declop.Operator(_handlers(seen), kubeconfig=kubeconfig, options=Options(namespaces=(namespace,), grace_period=5))

    async def until(what: str) -> None:
        while what not in seen:
            await asyncio.sleep(0.02)

    async def host() -> None:
        loop = asyncio.get_running_loop()
        async with op:
            assert op.loop is loop and op.ready()  # on the host's loop, no thread of its own
            assert _operator_threads() == []
            await asyncio.to_thread(core.create_namespaced_config_map, namespace, {"metadata": {"name": "in-loop"}})
            await asyncio.wait_for(until("in-loop"), 10)
        assert not op.running

        stop = asyncio.Event()  # the other form: run until the host's own event is set
        task = asyncio.ensure_future(op.run(stop))
        await op.await_ready(30)
        await asyncio.to_thread(core.create_namespaced_config_map, namespace, {"metadata": {"name": "by-run"}})
        await asyncio.wait_for(until("by-run"), 10)
        stop.set()
        await asyncio.wait_for(task, 30)
        assert not op.running and op.exit_code == 0

    asyncio.run(host())


def test_a_start_that_fails_raises_its_error_in_the_caller(kubeconfig):
    op = declop.Operator(declop.registry.Registry(), kubeconfig=kubeconfig)
    with pytest.raises(ConfigError, match="no reconciler is registered"):
        op.start()
    assert not op.running and _operator_threads() == []


def test_a_lost_lease_is_raised_to_the_host_and_the_process_lives(control_plane, namespace, tmp_path: Path):
    """The leader's connection is black-holed: after the renew deadline the Lease is lost, the
    embedded operator stops by itself and the host's wait() raises LeaseLost (``declop run``
    would exit 1); ``on_lost`` was called once; nothing exits the process."""
    seen: list[str] = []
    lost: list[bool] = []
    options = Options(
        namespaces=(namespace,), grace_period=5, leader_elect=True, leader_election_namespace=namespace,
        lease_duration=3.0, renew_deadline=2.0, retry_period=0.5,
    )  # fmt: skip
    with TcpProxy(control_plane.host) as proxy:
        kubeconfig = proxy.kubeconfig(control_plane.kubeconfig_path, tmp_path / "proxied.kubeconfig")
        op = declop.Operator(_handlers(seen), kubeconfig=kubeconfig, options=options, on_lost=lambda: lost.append(True))
        op.start()
        try:
            wait_for(lambda: op.manager is not None and op.manager.elector is not None and op.manager.elector.is_leader, 20, what="the Lease")
            proxy.blackhole()
            with pytest.raises(LeaseLost, match="lost its Lease"):
                assert op.wait(20), "the operator stops by itself after the loss"
            assert lost == [True] and op.exit_code == 1 and not op.running
        finally:
            proxy.forward()
            op.stop()
    assert _operator_threads() == []


def test_on_login_credentials_replace_the_kubeconfig_and_a_401_asks_again(control_plane, k8s_api, namespace, monkeypatch):
    """The login function hands out the control plane's admin credentials (read from its
    kubeconfig, which declop itself is not given: $KUBECONFIG points nowhere) — after a first
    answer with a token the apiserver refuses: the 401 asks the function again, and the same
    request is retried with the new answer."""
    from declop.kube.kubeconfig import load

    admin = load(control_plane.kubeconfig_path)
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    seen: list[str] = []
    registry = _handlers(seen)
    answers: list[str] = []

    @declop.on_login(registry=registry)
    def login(logger):
        answers.append("bad" if not answers else "admin")
        if answers[-1] == "bad":
            return {"server": admin.host, "token": "not-a-token", "ca_data": admin.ca_data}
        return declop.kube.login.ConnectionInfo(
            server=admin.host, token=admin.token, cert_data=admin.cert_data, key_data=admin.key_data, ca_data=admin.ca_data
        )

    with declop.Operator(registry, options=Options(namespaces=(namespace,), grace_period=5)) as op:
        assert op.manager.transport.configuration.source == "login function 'login'"
        kubernetes.client.CoreV1Api(k8s_api).create_namespaced_config_map(namespace, {"metadata": {"name": "logged-in"}})
        wait_for(lambda: "logged-in" in seen, 10, what="a reconcile with the login's credentials")
    assert answers == ["bad", "admin"]  # at start, then once after the 401 (no expiration: never again)
