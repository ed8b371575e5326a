"""Operating declop: probes, metrics, Kubernetes Events and Lease leader election, against a real
apiserver and with real processes."""

from __future__ import annotations

import signal
import socket
import textwrap
import time
import urllib.request

import kubernetes.client
import pytest

import declop
from declop.manager import Options
from declop.testing.cluster.runner import OperatorProcess, OperatorRunner, wait_for

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def metric(text: str, series: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if not line.startswith(series + "{") and not line.startswith(series + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_probes_and_metrics(kubeconfig, k8s_api, namespace):
    registry = declop.registry.Registry()

    @declop.reconciler("configmaps", registry=registry, labels="probe-test=yes")
    def probed(request, client, **_):
        client.get(request)
        if request.name == "fails":
            raise RuntimeError("always")

    health, metrics = free_port(), free_port()
    options = Options(namespaces=(namespace,), health_port=health, metrics_port=metrics, metrics_secure=False, grace_period=2)
    core = kubernetes.client.CoreV1Api(k8s_api)
    for name in ("a", "b", "fails"):
        core.create_namespaced_config_map(namespace, {"metadata": {"name": name, "labels": {"probe-test": "yes"}}})
    with OperatorRunner(registry, kubeconfig=kubeconfig, options=options):
        assert http_get(f"http://127.0.0.1:{health}/healthz") == (200, "ok")
        status, body = http_get(f"http://127.0.0.1:{health}/readyz?verbose")
        assert status == 200 and "[+]informer-sync:probed ok" in body
        assert http_get(f"http://127.0.0.1:{metrics}/healthz")[0] == 404  # separate ports, separate paths

        def scraped() -> str | None:
            text = http_get(f"http://127.0.0.1:{metrics}/metrics")[1]
            ok = metric(text, "controller_runtime_reconcile_total", controller="probed", result="success")
            errors = metric(text, "controller_runtime_reconcile_errors_total", controller="probed")
            # "fails" is retried with backoff: a scrape can land while one of its attempts runs
            # (active 1); between attempts the gauge must come back to 0
            idle = metric(text, "controller_runtime_active_workers", controller="probed") == 0
            return text if ok is not None and ok >= 2 and errors is not None and errors >= 2 and idle else None

        text = wait_for(scraped, 10, what="reconciles to show up in /metrics, between two attempts of 'fails'")
        assert metric(text, "workqueue_adds_total", name="probed", controller="probed") >= 3
        assert metric(text, "workqueue_retries_total", name="probed", controller="probed") >= 1
        assert metric(text, "workqueue_depth", name="probed", controller="probed") is not None
        assert metric(text, "workqueue_queue_duration_seconds_count", name="probed", controller="probed") >= 3
        assert metric(text, "workqueue_work_duration_seconds_count", name="probed", controller="probed") >= 3
        assert metric(text, "workqueue_unfinished_work_seconds", name="probed", controller="probed") is not None
        assert metric(text, "workqueue_longest_running_processor_seconds", name="probed", controller="probed") is not None
        assert metric(text, "controller_runtime_reconcile_time_seconds_count", controller="probed") >= 3
        assert metric(text, "controller_runtime_active_workers", controller="probed") == 0
        assert metric(text, "controller_runtime_max_concurrent_reconciles", controller="probed") == 1
        assert metric(text, "controller_runtime_terminal_reconcile_errors_total", controller="probed") == 0
        assert metric(text, "rest_client_requests_total", method="GET", code="200") >= 1
        # per informer, read at scrape time: 3 objects listed at start, held in its cache
        informer = f"configmaps in {namespace} (probe-test=yes)"
        assert metric(text, "declop_informer_objects_listed_total", informer=informer) == 3
        assert metric(text, "declop_informer_objects", informer=informer) == 3
        assert metric(text, "declop_informer_events_received_total", informer=informer) is not None


def test_readyz_waits_for_the_caches(control_plane, namespace, tmp_path):
    """An identity that may not list configmaps: /readyz stays 503 and says why; /healthz is fine."""
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "nobody"}})
    token = control_plane.service_account_token(namespace, "nobody")
    cfg = kubernetes.client.Configuration()
    cfg.host = control_plane.host
    cfg.ssl_ca_cert = control_plane.ca_file
    cfg.api_key = {"BearerToken": f"Bearer {token}"}
    registry = declop.registry.Registry()

    @declop.reconciler("configmaps", registry=registry)
    def blocked(**_):
        pass

    health = free_port()
    # the start-up permission check off: it would stop the start before any informer (what
    # test_rbac_generated.py asserts); here the informer itself meets the refusal, as when RBAC
    # is taken away from a running operator
    options = Options(namespaces=(namespace,), health_port=health, grace_period=1, check_permissions=False)
    runner = OperatorRunner(registry, configuration=cfg, options=options)
    runner.ready_timeout = 0.5
    with pytest.raises(AssertionError, match="caches to sync"):
        runner.start()
    try:
        assert http_get(f"http://127.0.0.1:{health}/healthz") == (200, "ok")
        wait_for(
            lambda: runner.call_soon(lambda: any(i.last_error for c in runner.manager.controllers for i in c.informers())),
            10, what="the informer to be refused",
        )
        status, body = http_get(f"http://127.0.0.1:{health}/readyz?verbose")
        assert status == 503
        # the failing check by name, never its error text (probes are unauthenticated)
        assert "[-]informer-sync:blocked failed\n" in body
        assert "orbidden" not in body and "nobody" not in body
    finally:
        runner.stop()


def test_events_are_recorded_and_rate_limited(kubeconfig, k8s_api, namespace):
    registry = declop.registry.Registry()
    sent: list[int] = []

    @declop.reconciler("configmaps", registry=registry, labels="event-test=yes")
    def noisy(request, client, obj, **_):
        if obj is None:
            return None
        for i in range(60):  # a hot loop: distinct messages, so no series folding
            client.event(obj, "Spam", f"message {i}", type="Warning")
        sent.append(1)

    core = kubernetes.client.CoreV1Api(k8s_api)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "loud", "labels": {"event-test": "yes"}}})
    with OperatorRunner(registry, kubeconfig=kubeconfig, options=Options(namespaces=(namespace,))) as op:
        wait_for(lambda: sent, 20)
        events = kubernetes.client.EventsV1Api(k8s_api).list_namespaced_event(namespace).items
        ours = [e for e in events if e.regarding and e.regarding.name == "loud"]
        assert 1 <= len(ours) <= 25  # client-go's spam filter: a burst of 25 per object
        e = ours[0]
        assert e.reason == "Spam" and e.type == "Warning" and e.note.startswith("message ")
        assert e.reporting_controller == "declop.io/noisy"
        assert op.manager.context.recorder.dropped >= 35


def test_event_repeats_become_a_series(kubeconfig, k8s_api, namespace):
    registry = declop.registry.Registry()
    done: list[int] = []

    @declop.reconciler("configmaps", registry=registry, labels="series-test=yes")
    def repeat(request, client, obj, **_):
        if obj is None:
            return None
        for _ in range(10):
            client.event(obj, "Same", "the same thing again")
        done.append(1)

    core = kubernetes.client.CoreV1Api(k8s_api)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "rep", "labels": {"series-test": "yes"}}})
    with OperatorRunner(registry, kubeconfig=kubeconfig, options=Options(namespaces=(namespace,))):
        wait_for(lambda: done, 20)
        events = [e for e in kubernetes.client.EventsV1Api(k8s_api).list_namespaced_event(namespace).items if e.reason == "Same"]
        assert len(events) == 1  # nine repeats folded, not nine more Events


LEADER_HANDLERS = """
import os
import declop

@declop.reconciler("configmaps", labels="leader-test=yes")
def elected(request, logger, **_):
    logger.info("Reconciled by " + os.environ["DECLOP_TEST_REPLICA"])
"""


def test_leader_election(control_plane, namespace, tmp_path):
    handlers = tmp_path / "handlers.py"
    handlers.write_text(textwrap.dedent(LEADER_HANDLERS))
    env = control_plane.env()
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    args = [str(handlers), "-n", namespace, "--leader-elect", "--leader-election-id", "bench-lock",
            "--leader-election-namespace", namespace, "--grace-period", "2"]

    def cm(name: str) -> None:
        core.create_namespaced_config_map(namespace, {"metadata": {"name": name, "labels": {"leader-test": "yes"}}})

    a = OperatorProcess(args, env={**env, "DECLOP_TEST_REPLICA": "a"})
    b = OperatorProcess(args, env={**env, "DECLOP_TEST_REPLICA": "b"})
    a.start()
    try:
        # a fresh namespace: the Lease is created a lease duration (15 s) after a's first read, and
        # a leads once the record stood for the renew deadline (10 s; docs/contract.md §7)
        a.wait_for_line("Successfully acquired lease", timeout=15 + 10 + 2 * 2.4 + 20)
        b.start()
        b.wait_for_line("Attempting to acquire leader lease")
        cm("one")
        a.wait_for_line('Reconciled by a {"controller": "elected", "namespace": "%s", "name": "one"' % namespace)
        # only the leader reconciles: b has synced its caches but runs no workers
        assert not any("Reconciled by" in line for line in b.lines)
        assert not any("Successfully acquired lease" in line for line in b.lines)

        # SIGKILL: no release; b takes over once the lease expires (15 s) on its own clock
        a.proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        b.wait_for_line("Successfully acquired lease", timeout=30)
        assert time.monotonic() - killed <= 15 + 2 * 2 + 1  # lease duration + retry periods + slack
        cm("two")
        b.wait_for_line('Reconciled by b {"controller": "elected", "namespace": "%s", "name": "two"' % namespace)
        a.stop()

        # SIGTERM: b drains and releases the lease; a new standby takes over within a few seconds
        c = OperatorProcess(args, env={**env, "DECLOP_TEST_REPLICA": "c"})
        c.start()
        try:
            c.wait_for_line("Attempting to acquire leader lease")
            stopped = time.monotonic()
            assert b.stop() == 0
            assert any("Released leader lease" in line for line in b.lines)
            c.wait_for_line("Successfully acquired lease", timeout=10)
            assert time.monotonic() - stopped <= 5, "handover after SIGTERM should take about one retry period"
            lease = kubernetes.client.CoordinationV1Api(control_plane.api_client()).read_namespaced_lease("bench-lock", namespace)
            assert lease.spec.holder_identity and lease.spec.lease_transitions >= 2
        finally:
            c.stop()
    finally:
        a.stop()
        b.stop()
