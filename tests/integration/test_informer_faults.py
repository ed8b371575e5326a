"""The informer against a real kube-apiserver through a TCP proxy that injects network faults
(declop.testing.cluster.faults.TcpProxy): cut connections and black holes."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

import declop
from declop.manager import Options
from declop.testing.cluster.faults import TcpProxy
from declop.testing.cluster.runner import OperatorRunner, wait_for

pytestmark = pytest.mark.integration


def make_cm(api: Any, namespace: str, name: str, data: dict[str, str] | None = None) -> Any:
    body = {"metadata": {"name": name}, "data": data or {"k": "v"}}
    return kubernetes.client.CoreV1Api(api).create_namespaced_config_map(namespace, body)


class Seen:
    """What the handler saw, by name: the data of each reconcile."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.data: dict[str, list[Any]] = {}

    def add(self, name: str, data: Any) -> None:
        with self.lock:
            self.data.setdefault(name, []).append(data)

    def last(self, name: str) -> Any:
        with self.lock:
            return (self.data.get(name) or [None])[-1]


def operator(registry: declop.registry.Registry, kubeconfig: str, namespace: str, **kw: Any) -> OperatorRunner:
    return OperatorRunner(registry, kubeconfig=kubeconfig, options=Options(namespaces=(namespace,), grace_period=5, **kw))


@pytest.mark.parametrize("mode", ["auto", "paged"])
def test_connection_resets_on_a_healthy_watch_rewatch_at_once_without_a_list(
    control_plane: Any, k8s_api: Any, namespace: str, tmp_path: Path, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 10: 10 connection resets on a healthy watch → each re-watch starts within 1 s of
    the reset, no relist, nothing missed. The resets are 2 s apart instead of 5 s: the watch has
    been working (events delivered, well over the 1 s very-short-watch threshold) before each
    one, which is all the 5 s stood for."""
    caplog.set_level(logging.INFO, "declop.informer")
    registry = declop.registry.Registry()
    seen = Seen()

    @declop.reconciler("configmaps", registry=registry)
    def watcher(name: str, obj: Any, **_: Any) -> None:
        seen.add(name, (obj or {}).get("data"))

    make_cm(k8s_api, namespace, "before")
    with TcpProxy(control_plane.host) as proxy:
        kubeconfig = proxy.kubeconfig(control_plane.kubeconfig_path, tmp_path / "via-proxy")
        with operator(registry, kubeconfig, namespace, list_mode=mode) as op:
            wait_for(lambda: seen.last("before"), 15)
            informer = op.manager.controllers[0].sources[0].informers[0]
            assert informer.last_sync_mode == ("stream" if mode == "auto" else "paged")
            lists = informer.lists
            stats = op.statistics().by_verb
            list_requests = stats.get("list", 0)
            delays = []
            for i in range(10):
                make_cm(k8s_api, namespace, f"cm-{i}")  # the watch is working: it delivers this
                wait_for(lambda i=i: seen.last(f"cm-{i}"), 15, what=f"cm-{i} through the watch")
                watches = op.statistics().by_verb.get("watch", 0)
                cut_at = time.monotonic()
                assert proxy.cut() >= 1
                # changed while the operator re-watches: must not be missed
                make_cm(k8s_api, namespace, f"during-{i}")
                wait_for(lambda w=watches: op.statistics().by_verb.get("watch", 0) > w, 10, interval=0.005,
                         what="the re-watch")
                delays.append(time.monotonic() - cut_at)
                wait_for(lambda i=i: seen.last(f"during-{i}"), 15, what=f"during-{i}")
                time.sleep(max(0.0, 2.0 - (time.monotonic() - cut_at)))  # pacing, not synchronisation
            assert max(delays) < 1.0, delays
            assert informer.lists == lists  # no relist
            assert op.statistics().by_verb.get("list", 0) == list_requests  # no LIST request
            assert all(seen.last(f"cm-{i}") and seen.last(f"during-{i}") for i in range(10))
    problems = [r for r in caplog.records if r.name == "declop.informer" and r.levelno >= logging.WARNING]
    assert problems == []


def test_a_black_holed_apiserver_is_waited_out_and_nothing_is_missed(
    control_plane: Any, k8s_api: Any, namespace: str, tmp_path: Path
) -> None:
    """A half-open connection (every byte held, nothing errors) ends by the idle timeout; the
    re-watch that cannot get an answer backs off; once the network is back the informer catches
    up from its resourceVersion without a relist."""
    registry = declop.registry.Registry()
    seen = Seen()

    @declop.reconciler("configmaps", registry=registry)
    def watcher(name: str, obj: Any, **_: Any) -> None:
        seen.add(name, (obj or {}).get("data"))

    make_cm(k8s_api, namespace, "before")
    with TcpProxy(control_plane.host) as proxy:
        kubeconfig = proxy.kubeconfig(control_plane.kubeconfig_path, tmp_path / "via-proxy")
        with operator(registry, kubeconfig, namespace) as op:
            wait_for(lambda: seen.last("before"), 15)
            informer = op.manager.controllers[0].sources[0].informers[0]
            informer.idle_timeout = 2.0  # the next watch; the running one keeps 90 s
            proxy.cut()
            # the re-watch is streaming (not merely sent) before the network goes silent:
            # otherwise the black hole would swallow its answer, not the stream
            make_cm(k8s_api, namespace, "after-cut")
            wait_for(lambda: seen.last("after-cut"), 15, what="the re-watch delivering")
            watches = op.statistics().by_verb.get("watch", 0)
            proxy.blackhole()
            make_cm(k8s_api, namespace, "during")
            # the silent watch ends (idle), the next one gets no answer and fails
            wait_for(lambda: informer.last_error, 20, what="a failed re-watch")
            assert op.statistics().by_verb.get("watch", 0) > watches
            proxy.forward()
            wait_for(lambda: seen.last("during"), 40, what="the change made during the black hole")
            wait_for(lambda: informer.last_error == "", 40, what="the watch working again")
            assert informer.lists == 1  # caught up by re-watching from its resourceVersion
