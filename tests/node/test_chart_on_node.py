"""The chart's Pod for real: the image built from the Dockerfile, run by a kubelet on a real node.

Every test installs the chart with helm as a user would (``--wait`` needs the readiness probe to
pass) and checks what only a running Pod shows: the seed's lines in ``kubectl logs``, a rolling
update under leader election, a rolling update of three sharded Pods under churn, the liveness
probe restarting a wedged operator, the metrics Service from another Pod, and the restricted
securityContext inside the container.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import kubernetes.watch
import pytest

from declop.testing import ControlPlane, wait_for
from declop.testing.cluster.image import BuiltImage

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "declop"
PODS = ROOT / "examples" / "pods.py"
SEED_LINE = re.compile(
    r'^INFO (Pod created|The pod was deleted) \{"controller": "example", "namespace": "default", '
    r'"name": "nginx", "reconcileID": "[0-9a-f-]{36}"\}$'
)


def sh(cp: ControlPlane, *args: str, check: bool = True, timeout: float = 180) -> str:
    result = subprocess.run(
        list(args), env=cp.env(), capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr}")
    return result.stdout


def kubectl_json(cp: ControlPlane, *args: str) -> Any:
    return json.loads(sh(cp, "kubectl", *args, "-o", "json"))


def helm(cp: ControlPlane, verb: str, release: str, namespace: str, values: dict[str, Any], *extra: str) -> None:
    """``helm install|upgrade`` the chart with ``values`` (a JSON values file), waiting for Ready."""
    path = Path(cp.tmp_dir) / f"{release}-{verb}-values.json"
    path.write_text(json.dumps(values))
    sh(
        cp, "helm", verb, release, str(CHART), "-n", namespace, "--create-namespace",
        "-f", str(path), "--wait", "--timeout", "120s", *extra,
    )  # fmt: skip


def image_values(image: BuiltImage) -> dict[str, Any]:
    repository, _, tag = image.name.rpartition(":")
    return {"image": {"repository": repository, "tag": tag, "pullPolicy": "Never"}}


def pods_of(cp: ControlPlane, namespace: str, release: str) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/instance={release}"
    items: list[dict[str, Any]] = kubectl_json(cp, "get", "pods", "-n", namespace, "-l", selector)["items"]
    return items


class LogFollower:
    """``kubectl logs -f`` of one Pod in a thread; keeps every line until the container ends."""

    def __init__(self, cp: ControlPlane, namespace: str, pod: str) -> None:
        self.pod = pod
        self.lines: list[str] = []
        self._proc = subprocess.Popen(
            ["kubectl", "logs", "-f", "-n", namespace, pod],
            env=cp.env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
        self._proc.wait(10)
        self._thread.join(10)  # every line read before the caller looks at them


def seed_scenario(cp: ControlPlane, namespace: str, release: str) -> list[str]:
    """The seed's kubectl run / label / delete; returns the operator's nginx lines, in order."""
    deployment = f"deploy/{release}-declop"

    def nginx_lines() -> list[str]:
        out = sh(cp, "kubectl", "logs", "-n", namespace, deployment)
        return [line for line in out.splitlines() if '"name": "nginx"' in line]

    sh(cp, "kubectl", "run", "nginx", "--image", "nginx")
    # a fresh namespace: the leader Lease is created 15 s after the first read and leads 10 s
    # later (contract.md §7), so the first reconcile can come ~27 s after the Pod started
    wait_for(lambda: len(nginx_lines()) >= 1, timeout=60, what="'Pod created' for nginx")
    sh(cp, "kubectl", "label", "pod", "nginx", "env=prod")
    wait_for(lambda: len(nginx_lines()) >= 2, timeout=30, what="'Pod created' after the label")
    sh(cp, "kubectl", "delete", "pod", "nginx", timeout=120)  # plain: the kubelet finishes it
    wait_for(
        lambda: any("The pod was deleted" in line for line in nginx_lines()),
        timeout=60,
        what="'The pod was deleted'",
    )
    return nginx_lines()


def assert_seed_lines(lines: list[str]) -> None:
    """Created, created again on the label, then deleted — in that order.

    Level-triggered, so the counts after the label are not fixed: the graceful delete's updates
    (deletionTimestamp, the kubelet's status) may each find the pod still there ("Pod created"),
    and an update queued while the last reconcile ran may find it gone once more ("The pod was
    deleted" twice). What never happens is a line out of order.
    """
    assert all(SEED_LINE.match(line) for line in lines), lines
    messages = [SEED_LINE.match(line).group(1) for line in lines]  # type: ignore[union-attr]
    assert messages[:2] == ["Pod created", "Pod created"], lines
    first_deleted = messages.index("The pod was deleted")
    assert set(messages[:first_deleted]) == {"Pod created"}, lines
    assert set(messages[first_deleted:]) == {"The pod was deleted"}, lines
    ids = [re.search(r'"reconcileID": "([^"]+)"', line).group(1) for line in lines]  # type: ignore[union-attr]
    assert len(set(ids)) == len(ids), "every reconcile has its own reconcileID"


@pytest.fixture
def release_namespace(cluster: ControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    yield name
    # as a user removes a release: helm uninstall first (it deletes the release's cluster-scoped
    # objects too, e.g. webhook configurations that would refuse writes with no operator left)
    for release in sh(cluster, "helm", "list", "-n", name, "-q", check=False).split():
        sh(cluster, "helm", "uninstall", release, "-n", name, "--wait", check=False)
    sh(cluster, "kubectl", "delete", "namespace", name, "--wait=false", check=False)
    sh(cluster, "kubectl", "delete", "pod", "nginx", "--ignore-not-found", "--wait=false", check=False)


def test_seed_scenario_with_handlers_from_a_configmap(
    cluster: ControlPlane, declop_image_built: BuiltImage, release_namespace: str
) -> None:
    values = {
        **image_values(declop_image_built),
        "handlers": {"files": {"pods.py": PODS.read_text()}},
        "rbac": {"watch": [{"group": "", "resource": "pods"}]},
    }
    helm(cluster, "install", "seed", release_namespace, values)
    assert_seed_lines(seed_scenario(cluster, release_namespace, "seed"))


def test_seed_scenario_from_an_image_built_from_the_declop_image(
    cluster: ControlPlane, operator_image: BuiltImage, release_namespace: str
) -> None:
    values = {
        **image_values(operator_image),
        "handlers": {"path": "/app/handlers/pods.py"},
        "rbac": {"watch": [{"group": "", "resource": "pods"}]},
    }
    helm(cluster, "install", "baked", release_namespace, values)
    assert_seed_lines(seed_scenario(cluster, release_namespace, "baked"))


def test_the_container_runs_read_only_as_the_charts_user_without_capabilities(
    cluster: ControlPlane, declop_image_built: BuiltImage, release_namespace: str
) -> None:
    values = {**image_values(declop_image_built), "handlers": {"example": True}}
    helm(cluster, "install", "locked", release_namespace, values)
    exec_ = ["kubectl", "exec", "-n", release_namespace, "deploy/locked-declop", "--"]
    assert sh(cluster, *exec_, "id", "-u").strip() == "65532"
    assert sh(cluster, *exec_, "id", "-g").strip() == "65532"
    write = subprocess.run(
        [*exec_, "python3", "-c", "open('/written-by-test', 'w')"],
        env=cluster.env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert write.returncode != 0 and "Read-only file system" in write.stderr, write.stderr
    status = sh(cluster, *exec_, "cat", "/proc/1/status")
    capabilities = dict(line.split(":\t") for line in status.splitlines() if line.startswith("Cap"))
    assert capabilities["CapEff"] == capabilities["CapPrm"] == "0000000000000000", capabilities
    assert "NoNewPrivs:\t1" in status
    # /tmp (HOME) is the chart's writable emptyDir.
    sh(cluster, *exec_, "python3", "-c", "open('/tmp/ok', 'w').write('x')")


def test_metrics_are_reachable_through_the_charts_service_from_another_pod(
    cluster: ControlPlane, declop_image_built: BuiltImage, release_namespace: str
) -> None:
    values = {**image_values(declop_image_built), "handlers": {"example": True}}
    helm(cluster, "install", "scraped", release_namespace, values)
    service = kubectl_json(cluster, "get", "service", "-n", release_namespace, "scraped-declop-metrics")
    # secure metrics (the chart's default): HTTPS, and a token bound to the metrics-reader ClusterRole
    url = f"https://{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}/metrics"
    sh(cluster, "kubectl", "create", "serviceaccount", "scraper", "-n", release_namespace)
    sh(cluster, "kubectl", "create", "clusterrolebinding", f"{release_namespace}-scraper",
       f"--clusterrole={release_namespace}-scraped-declop-metrics-reader", f"--serviceaccount={release_namespace}:scraper")
    script = (
        "import ssl, urllib.request; ctx = ssl._create_unverified_context(); "
        "token = open('/var/run/secrets/kubernetes.io/serviceaccount/token').read(); "
        f"req = urllib.request.Request({url!r}, headers={{'Authorization': 'Bearer ' + token}}); "
        "print(urllib.request.urlopen(req, timeout=10, context=ctx).read().decode())"
    )
    try:
        out = sh(
            cluster, "kubectl", "run", "scraper", "-n", release_namespace, "--rm", "-i", "--restart=Never",
            f"--image={declop_image_built.name}", "--image-pull-policy=Never",
            '--overrides={"spec": {"serviceAccountName": "scraper"}}',
            "--command", "--", "python3", "-c", script,
        )  # fmt: skip
    finally:
        sh(cluster, "kubectl", "delete", "clusterrolebinding", f"{release_namespace}-scraper", "--ignore-not-found")
    assert "workqueue_depth" in out and "controller_runtime_reconcile_total" in out, out[-2000:]


ORPHANS = '''
import subprocess

import declop


@declop.reconciler("configmaps")
def orphans(request, obj, logger, **_):
    if obj is None or obj["metadata"]["name"] != "orphans":
        return None
    # sh exits at once and is waited for; its background sleeps are orphaned: the kernel gives
    # them to PID 1, and nothing in declop ever waits for them
    script = "for i in 1 2 3; do sleep 3 >/dev/null 2>&1 & echo $!; done"
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True)
    logger.info("orphans spawned", pids=[int(pid) for pid in out.stdout.split()])
'''

#: every process of the container's PID namespace: {pid: [state, ppid, comm]}
PROCESSES = (
    "import json, os\n"
    "procs = {}\n"
    "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
    "    try:\n"
    "        stat = open(f'/proc/{pid}/stat').read()\n"
    "    except OSError:\n"
    "        continue\n"
    "    state, ppid = stat.rpartition(')')[2].split()[:2]\n"
    "    procs[pid] = [state, int(ppid), stat[stat.index('(') + 1:stat.rindex(')')]]\n"
    "print(json.dumps(procs))\n"
)


def test_pid_1_is_tini_which_reaps_the_orphans_of_handler_subprocesses(
    cluster: ControlPlane, declop_image_built: BuiltImage, release_namespace: str
) -> None:
    values = {
        **image_values(declop_image_built),
        "handlers": {"files": {"orphans.py": ORPHANS}},
        "watchNamespaces": [release_namespace],
        "rbac": {"scope": "namespaces", "watch": [{"group": "", "resource": "configmaps"}]},
    }
    helm(cluster, "install", "reaper", release_namespace, values)
    exec_ = ["kubectl", "exec", "-n", release_namespace, "deploy/reaper-declop", "--"]
    cmdline = sh(cluster, *exec_, "cat", "/proc/1/cmdline").split("\0")
    assert cmdline[:4] == ["tini", "--", "declop", "run"], cmdline

    def processes() -> dict[int, list[Any]]:
        out = sh(cluster, *exec_, "python3", "-c", PROCESSES)
        return {int(pid): info for pid, info in json.loads(out).items()}

    sh(cluster, "kubectl", "create", "configmap", "orphans", "-n", release_namespace)

    def spawned() -> list[int] | None:
        out = sh(cluster, "kubectl", "logs", "-n", release_namespace, "deploy/reaper-declop")
        found = re.search(r'orphans spawned .*"pids": \[([0-9, ]+)\]', out)
        return [int(pid) for pid in found.group(1).split(", ")] if found else None

    pids = wait_for(spawned, timeout=30, interval=0.5, what="the handler's 'orphans spawned' line")
    assert len(pids) == 3
    # while they sleep, they are PID 1's (tini's) children: the orphans were re-parented to it
    alive = {pid: info for pid, info in processes().items() if pid in pids}
    assert all(info[1] == 1 and info[2] == "sleep" for info in alive.values()), alive
    # once they exit, tini reaps them: no zombie is left (declop as PID 1 would keep them as Z)
    wait_for(
        lambda: not set(pids) & set(processes()), timeout=30, interval=0.5,
        what="the orphans to exit and be reaped",
    )  # fmt: skip
    zombies = {pid: info for pid, info in processes().items() if info[0] == "Z"}
    assert zombies == {}, zombies


WEDGE = '''
import time

import declop


@declop.reconciler("configmaps")
async def wedge(request, obj, logger, **_):
    if obj is not None and obj["metadata"]["name"] == "wedge":
        logger.info("blocking the event loop")
        time.sleep(3600)  # a sync call inside async def: the loop stops
'''


def test_the_liveness_probe_restarts_a_pod_whose_event_loop_is_wedged(
    cluster: ControlPlane, declop_image_built: BuiltImage, release_namespace: str
) -> None:
    values = {
        **image_values(declop_image_built),
        "handlers": {"files": {"wedge.py": WEDGE}},
        "watchNamespaces": [release_namespace],
        "rbac": {"scope": "namespaces", "watch": [{"group": "", "resource": "configmaps"}]},
        "gracePeriod": 1,
        "livenessProbe": {"initialDelaySeconds": 1, "periodSeconds": 2, "timeoutSeconds": 1, "failureThreshold": 2},
    }
    helm(cluster, "install", "wedged", release_namespace, values)
    (pod,) = pods_of(cluster, release_namespace, "wedged")
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    sh(cluster, "kubectl", "create", "configmap", "wedge", "-n", release_namespace)

    def restarted() -> dict[str, Any] | None:
        (now,) = pods_of(cluster, release_namespace, "wedged")
        status = now["status"]["containerStatuses"][0]
        return status if status["restartCount"] >= 1 else None

    status = wait_for(restarted, timeout=90, what="the kubelet to restart the wedged container")
    events = sh(cluster, "kubectl", "get", "events", "-n", release_namespace, "--field-selector",
                f"involvedObject.name={pod['metadata']['name']}")  # fmt: skip
    assert "Liveness probe failed" in events, events
    assert status["lastState"]["terminated"]["exitCode"] != 0


SLOW = '''
import time

import declop


@declop.reconciler("configmaps")
def slow(request, obj, logger, **_):
    if obj is None or obj["metadata"].get("labels", {}).get("slow") != "yes":
        return None
    logger.info("reconcile start", at=time.time())
    time.sleep(20)
    logger.info("reconcile end", at=time.time())
'''


def test_helm_upgrade_to_two_replicas_never_has_two_pods_reconciling_and_the_old_pod_exits_0(
    cluster: ControlPlane, declop_image_built: BuiltImage, release_namespace: str
) -> None:
    namespace = release_namespace
    values = {
        **image_values(declop_image_built),
        "handlers": {"files": {"slow.py": SLOW}},
        "watchNamespaces": [namespace],
        "rbac": {"scope": "namespaces", "watch": [{"group": "", "resource": "configmaps"}]},
    }
    helm(cluster, "install", "ha", namespace, values)  # one replica; leader election is the default
    # a watch, not a poll: the old Pod's terminated state can stand for less than a poll's
    # interval before the kubelet deletes the Pod (CI missed the exit code that way)
    pods = PodWatch(cluster, namespace, "ha")
    followers, exits = pods.followers, pods.exits
    try:
        old = {p["metadata"]["name"] for p in pods_of(cluster, namespace, "ha")}
        wait_for(lambda: set(followers) >= old, timeout=30, what="log followers on both Pods")
        sh(cluster, "kubectl", "create", "configmap", "slow", "-n", namespace)
        sh(cluster, "kubectl", "label", "configmap", "slow", "-n", namespace, "slow=yes")
        leader = wait_for(
            lambda: next((n for n, f in followers.items() if any("reconcile start" in l for l in f.lines)), None),
            timeout=60, what="the leader to start its 20 s reconcile",  # a fresh Lease: ~27 s
        )  # fmt: skip
        # Scale to two and change the Pod template: a rolling update (maxSurge 1) while the
        # leader's reconcile runs; the kubelet sends the old Pod SIGTERM.
        helm(cluster, "upgrade", "ha", namespace, values, "--set", "replicaCount=2",
             "--set", "podAnnotations.rollout=two")  # fmt: skip
        # The new leader (a new Pod) starts the same reconcile again once the old one released.
        wait_for(
            lambda: any(
                any("reconcile start" in l for l in f.lines) for n, f in followers.items() if n not in old
            ),
            timeout=90, what="a new Pod to take over and reconcile",
        )  # fmt: skip
        wait_for(lambda: leader in exits, timeout=30, what="the old leader's exit code")
    finally:
        pods.close()
    assert pods.error is None, pods.error
    assert exits[leader] == 0, exits
    intervals = []
    for name, follower in followers.items():
        starts = [float(re.search(r'"at": ([0-9.]+)', l).group(1)) for l in follower.lines if "reconcile start" in l]  # type: ignore[union-attr]
        ends = [float(re.search(r'"at": ([0-9.]+)', l).group(1)) for l in follower.lines if "reconcile end" in l]  # type: ignore[union-attr]
        for i, start in enumerate(starts):
            intervals.append((start, ends[i] if i < len(ends) else float("inf"), name))
    intervals.sort()
    assert len(intervals) >= 2, intervals
    for (_, end, first), (start, _, second) in zip(intervals, intervals[1:]):
        assert start >= end, f"{second} started at {start} before {first} ended at {end}"
    # The old leader drained: its reconcile ended, after SIGTERM, before it exited.
    assert any(name == leader and end != float("inf") for _, end, name in intervals)


HANDOVER = '''
import time

import declop


@declop.reconciler("configmaps", labels="shard-test=yes")
def handover(name, obj, client, logger, **_):
    if obj is None:
        return None
    want = (obj.get("data") or {}).get("v")
    logger.info("reconcile start", at=time.time(), v=want)
    time.sleep(0.06)  # long enough that two Pods reconciling one key at once would overlap
    if (obj["metadata"].get("annotations") or {}).get("seen") != want:
        client.patch(obj, {"metadata": {"annotations": {"seen": want}}})
    logger.info("reconcile end", at=time.time())
'''
SHARDS = 12
OBJECTS = 80


class PodWatch:
    """Every Pod of a release through a watch: a LogFollower per Pod once its container runs, and
    each container's exit code and restarts.

    A watch, not polling: a rolled-out Pod's terminated state can stand for less than a poll's
    interval before the Pod object is deleted, but the watch delivers every change of it.
    """

    def __init__(self, cp: ControlPlane, namespace: str, release: str) -> None:
        self.cp, self.namespace, self.release = cp, namespace, release
        self.followers: dict[str, LogFollower] = {}
        self.exits: dict[str, int] = {}
        self.restarts: dict[str, int] = {}
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _see(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            self.restarts[name] = max(self.restarts.get(name, 0), status.get("restartCount", 0))
            state = status.get("state") or {}
            if name not in self.followers and ("running" in state or "terminated" in state):
                self.followers[name] = LogFollower(self.cp, self.namespace, name)
            if "terminated" in state:
                self.exits[name] = state["terminated"]["exitCode"]

    def _run(self) -> None:
        api = self.cp.api_client()
        core = kubernetes.client.CoreV1Api(api)
        w = kubernetes.watch.Watch()
        selector = f"app.kubernetes.io/instance={self.release}"
        try:
            while not self._stop.is_set():
                try:
                    for event in w.stream(core.list_namespaced_pod, self.namespace, label_selector=selector,
                                          resource_version=w.resource_version, timeout_seconds=5):  # fmt: skip
                        self._see(event["raw_object"])
                except kubernetes.client.ApiException as e:
                    if e.status != 410:
                        raise
                    w.resource_version = None  # expired: list again (every Pod comes as ADDED)
        except BaseException as e:  # noqa: BLE001 - the test asserts there was none
            self.error = e
        finally:
            api.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(15)
        for follower in self.followers.values():
            follower.close()


def reconcile_intervals(followers: dict[str, LogFollower]) -> list[dict[str, Any]]:
    """Every handler call of the followed Pods: key, pod, v, start and end (``inf`` if no end was
    logged), matched by (pod, reconcileID, key)."""
    calls: dict[tuple[str, str, str], dict[str, Any]] = {}
    for pod, follower in followers.items():
        for line in list(follower.lines):
            if not line.startswith("{"):
                continue
            record = json.loads(line)
            if record.get("msg") not in ("reconcile start", "reconcile end"):
                continue
            ident = (pod, record["reconcileID"], record["name"])
            if record["msg"] == "reconcile start":
                calls[ident] = {"key": record["name"], "pod": pod, "v": record["v"], "start": record["at"], "end": float("inf")}
            else:
                calls[ident]["end"] = record["at"]
    return list(calls.values())


def overlaps_across_pods(calls: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Pairs of calls of one key on two different Pods whose [start, end] intervals intersect."""
    by_key: dict[str, list[dict[str, Any]]] = {}
    for call in calls:
        by_key.setdefault(call["key"], []).append(call)
    found = []
    for key_calls in by_key.values():
        key_calls.sort(key=lambda c: c["start"])
        for i, first in enumerate(key_calls):
            for second in key_calls[i + 1 :]:
                if second["start"] >= first["end"]:
                    continue  # sorted by start: later ones may still overlap a longer `first`
                if second["pod"] != first["pod"]:
                    found.append((first, second))
    return found


def test_helm_rolling_update_with_sharding_has_no_key_on_two_pods_at_once_and_loses_no_update(
    cluster: ControlPlane, declop_image_built: BuiltImage, release_namespace: str
) -> None:
    """Issue 13: a RollingUpdate of 3 sharded Pods (12 ranges) under churn — no key reconciled by
    two Pods at once, every update reconciled, every old Pod drained and exited 0."""
    namespace = release_namespace
    values = {
        **image_values(declop_image_built),
        "handlers": {"files": {"handover.py": HANDOVER}},
        "watchNamespaces": [namespace],
        "rbac": {"scope": "namespaces", "watch": [{"group": "", "resource": "configmaps", "verbs": ["patch"]}]},
        "replicaCount": 3,
        "sharding": {"enabled": True, "shards": SHARDS},
        "logFormat": "json",
    }
    helm(cluster, "install", "sh", namespace, values)
    api = cluster.api_client()
    core = kubernetes.client.CoreV1Api(api)
    leases = kubernetes.client.CoordinationV1Api(api)
    pods = PodWatch(cluster, namespace, "sh")
    expected: dict[str, str] = {}

    def converged() -> bool:
        items = core.list_namespaced_config_map(namespace, label_selector="shard-test=yes").items
        seen = {cm.metadata.name: (cm.metadata.annotations or {}).get("seen") for cm in items}
        return seen == expected

    def range_holders() -> dict[str, str]:
        return {
            lease.metadata.name: lease.spec.holder_identity or ""
            for lease in leases.list_namespaced_lease(namespace).items
            if "-shard-" in lease.metadata.name and lease.metadata.name.endswith(f"-of-{SHARDS}")
        }

    churned: list[str] = []
    churn_errors: list[BaseException] = []
    stop_churn = threading.Event()

    def churn() -> None:  # a new data.v for a random object every ~50 ms until stopped
        rng = random.Random(13)
        own = cluster.api_client()
        core = kubernetes.client.CoreV1Api(own)
        try:
            while not stop_churn.is_set():
                name, value = rng.choice(sorted(expected)), f"c{len(churned)}"
                core.patch_namespaced_config_map(name, namespace, {"data": {"v": value}})
                expected[name] = value
                churned.append(name)
                stop_churn.wait(0.05)  # pacing, not synchronisation
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            churn_errors.append(e)
        finally:
            own.close()

    try:
        old = {p["metadata"]["name"] for p in pods_of(cluster, namespace, "sh")}
        assert len(old) == 3, old
        wait_for(lambda: set(pods.followers) >= old, timeout=30, interval=0.2, what="log followers on the 3 Pods")
        for i in range(OBJECTS):
            name = f"cm-{i}"
            core.create_namespaced_config_map(namespace, {"metadata": {"name": name, "labels": {"shard-test": "yes"}}, "data": {"v": "0"}})
            expected[name] = "0"
        wait_for(converged, timeout=120, interval=0.5, what=f"the {OBJECTS} objects seen by the 3 Pods")
        wait_for(
            lambda: (h := range_holders()) and len(h) == SHARDS and all(v.split("_")[0] in old for v in h.values()) and h,
            timeout=60, interval=0.5, what=f"the {SHARDS} range Leases held by the first Pods",
        )  # fmt: skip
        churner = threading.Thread(target=churn, daemon=True)
        churner.start()
        wait_for(lambda: len(churned) >= 20, timeout=30, interval=0.1, what="churn running")
        before_rollout = len(churned)
        started = time.monotonic()
        # A new Pod template: a RollingUpdate (maxSurge 1, maxUnavailable 0) of the 3 Pods; each
        # old Pod gets SIGTERM, drains its ranges and releases their Leases.
        helm(cluster, "upgrade", "sh", namespace, values, "--set", "podAnnotations.rollout=two", "--timeout", "300s")
        wait_for(lambda: old <= set(pods.exits), timeout=60, interval=0.2, what="the exit codes of the 3 old Pods")
        rollout = time.monotonic() - started
        stop_churn.set()
        churner.join(10)
        during_rollout = len(churned) - before_rollout
        assert not churn_errors, churn_errors
        # Every update made during the rollout is reconciled (none lost in a handover)...
        wait_for(converged, timeout=120, interval=0.5, what="every churned update seen")
        # ...and a last update of every object, reconciled by the new Pods alone.
        for name in sorted(expected):
            core.patch_namespaced_config_map(name, namespace, {"data": {"v": "final"}})
            expected[name] = "final"
        wait_for(converged, timeout=120, interval=0.5, what="every object's last update seen")
        new = {p["metadata"]["name"] for p in pods_of(cluster, namespace, "sh")} - old
        assert len(new) == 3, new
        # Balanced again: ceil(12 / 3) = 4 ranges for each new Pod, none left to an old one.
        wait_for(
            lambda: Counter(h.split("_")[0] for h in range_holders().values()) == dict.fromkeys(new, SHARDS // 3),
            timeout=60, interval=0.5, what=f"the {SHARDS} range Leases held 4 by 4 by the new Pods",
        )  # fmt: skip
        # The last update's calls, as the new Pods logged them (the lines may trail the patches).
        wait_for(
            lambda: {c["key"] for c in reconcile_intervals(pods.followers) if c["pod"] in new and c["v"] == "final"}
            == set(expected),
            timeout=30, interval=0.5, what="every key's last update in a new Pod's log",
        )  # fmt: skip
    finally:
        stop_churn.set()
        pods.close()
        api.close()

    assert pods.error is None, pods.error
    calls = reconcile_intervals(pods.followers)
    clashes = overlaps_across_pods(calls)
    assert not clashes, clashes[:5]
    assert {name: pods.exits[name] for name in old} == dict.fromkeys(old, 0), pods.exits
    assert all(pods.restarts.get(name, 0) == 0 for name in old | new), pods.restarts
    # Graceful drain: every call an old Pod started, it finished before exiting.
    unfinished = [c for c in calls if c["pod"] in old and c["end"] == float("inf")]
    assert not unfinished, unfinished
    # Work moved (awaited above: the last update of every key was reconciled on a new Pod, the
    # old ones being gone): every new Pod reconciled keys, and handed-over ranges were acquired.
    assert all(any(c["pod"] == name for c in calls) for name in new), {c["pod"] for c in calls}
    handovers = {
        name: sum('"msg": "Acquired shard"' in line for line in follower.lines)
        for name, follower in pods.followers.items()
    }
    assert all(handovers[name] >= 1 for name in new), handovers
    assert during_rollout >= 20, f"only {during_rollout} updates during the rollout"
    lease_lines = Counter(
        json.loads(line)["msg"]
        for follower in pods.followers.values()
        for line in follower.lines
        if line.startswith("{") and any(f'"msg": "{m}"' in line for m in ("Released shard", "Shard lease lost"))
    )
    print(
        f"rollout {rollout:.1f} s, {during_rollout} updates during it, {len(churned)} in all; "
        f"{len(calls)} handler calls over {len(pods.followers)} Pods, none overlapping across Pods; "
        f"ranges acquired per Pod {handovers}; {dict(lease_lines)}"
    )
