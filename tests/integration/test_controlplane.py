"""declop.testing.ControlPlane and its pytest fixtures against real etcd + kube-apiserver + kcm.

Synchronisation is always a poll with a deadline (:func:`wait_for`), never a bare sleep.
"""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import kubernetes.client as k8s
import pytest
import urllib3
from kubernetes import watch

from declop.errors import ConfigError
from declop.testing import ControlPlane, find_assets
from declop.testing.cluster.plugin import namespace_name

pytestmark = pytest.mark.integration

T = TypeVar("T")


def wait_for(check: Callable[[], T], timeout: float = 30.0, what: str = "condition") -> T:
    """Call ``check`` every 0.1 s until it returns something truthy; return that; fail at timeout."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.1)


def configmap(name: str, **meta: Any) -> k8s.V1ConfigMap:
    return k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=name, **meta), data={"k": name})


def gone(read: Callable[[], object]) -> bool:
    """True once ``read()`` answers 404."""
    try:
        read()
    except k8s.ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def kubectl(plane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", *args], env=plane.env(), capture_output=True, text=True, timeout=60, check=False
    )


def test_namespace_fixture_names_are_dns_labels(namespace: str) -> None:
    assert namespace.startswith("t-test-namespace-fixture-names-are-dns-labels-")
    label = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    for test_name in ("x" * 200, "test_a[param-1/Ü]", "___", "A" * 57 + "-b"):
        name = namespace_name(test_name)
        assert len(name) <= 63 and label.match(name), name


# -- the Python client ---------------------------------------------------------------------


def test_startup_time(control_plane: ControlPlane) -> None:
    assert control_plane.startup_seconds is not None
    print(f"\ncontrol plane start to ready: {control_plane.startup_seconds:.2f} s")


def test_configmaps_create_list_and_watch(k8s_api: k8s.ApiClient, namespace: str) -> None:
    core = k8s.CoreV1Api(k8s_api)
    assert namespace in {ns.metadata.name for ns in core.list_namespace().items}

    core.create_namespaced_config_map(namespace, configmap("first"))
    listed = core.list_namespaced_config_map(namespace)
    assert "first" in {cm.metadata.name for cm in listed.items}

    core.create_namespaced_config_map(namespace, configmap("second"))
    w = watch.Watch()
    seen = []
    for event in w.stream(
        core.list_namespaced_config_map,
        namespace,
        resource_version=listed.metadata.resource_version,
        timeout_seconds=20,
    ):
        seen.append((event["type"], event["object"].metadata.name))
        if seen[-1] == ("ADDED", "second"):
            w.stop()
    assert ("ADDED", "second") in seen
    assert ("ADDED", "first") not in seen  # the watch starts after the list's resourceVersion


# -- kubectl ------------------------------------------------------------------------------


def test_kubectl_uses_the_fixture_kubeconfig(
    control_plane: ControlPlane, kubeconfig: str, namespace: str
) -> None:
    result = kubectl(control_plane, "--kubeconfig", kubeconfig, "get", "ns", "-o", "name")
    assert result.returncode == 0, result.stderr
    assert f"namespace/{namespace}" in result.stdout.split()

    result = kubectl(control_plane, "version", "-o", "json")
    assert result.returncode == 0, result.stderr
    server = json.loads(result.stdout)["serverVersion"]
    assert (server["major"], server["minor"]) == ("1", "36")


# -- authentication and authorization -------------------------------------------------------


def _list_configmaps_status(plane: ControlPlane, namespace: str, token: str) -> int:
    request = urllib.request.Request(
        f"{plane.host}/api/v1/namespaces/{namespace}/configmaps",
        headers={"Authorization": f"Bearer {token}"},
    )
    context = ssl.create_default_context(cafile=plane.ca_file)
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_rbac_is_enforced_for_service_account_tokens(
    control_plane: ControlPlane, k8s_api: k8s.ApiClient, namespace: str
) -> None:
    core, rbac = k8s.CoreV1Api(k8s_api), k8s.RbacAuthorizationV1Api(k8s_api)
    core.create_namespaced_service_account(
        namespace, k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name="robot"))
    )
    token = control_plane.service_account_token(namespace, "robot", expiration_seconds=600)
    assert _list_configmaps_status(control_plane, namespace, token) == 403

    rbac.create_namespaced_role(
        namespace,
        k8s.V1Role(
            metadata=k8s.V1ObjectMeta(name="read-configmaps"),
            rules=[
                k8s.V1PolicyRule(api_groups=[""], resources=["configmaps"], verbs=["get", "list"])
            ],
        ),
    )
    rbac.create_namespaced_role_binding(
        namespace,
        k8s.V1RoleBinding(
            metadata=k8s.V1ObjectMeta(name="robot-reads"),
            role_ref=k8s.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="Role", name="read-configmaps"
            ),
            subjects=[k8s.RbacV1Subject(kind="ServiceAccount", name="robot", namespace=namespace)],
        ),
    )
    wait_for(
        lambda: _list_configmaps_status(control_plane, namespace, token) == 200,
        what="the RoleBinding to take effect",
    )


def test_added_user_is_authenticated_but_not_authorized(
    control_plane: ControlPlane, namespace: str
) -> None:
    user_kubeconfig = control_plane.add_user("alice", groups=["dev"])
    result = kubectl(control_plane, "--kubeconfig", user_kubeconfig, "get", "cm", "-n", namespace)
    assert result.returncode != 0
    assert 'User "alice"' in result.stderr and "forbidden" in result.stderr

    result = kubectl(control_plane, "--kubeconfig", user_kubeconfig, "auth", "whoami", "-o", "json")
    assert result.returncode == 0, result.stderr
    user_info = json.loads(result.stdout)["status"]["userInfo"]
    assert user_info["username"] == "alice"
    assert "dev" in user_info["groups"]


# -- apiserver restart under a live watch ----------------------------------------------------


class RawWatcher(threading.Thread):
    """Watches ConfigMaps in one namespace over raw HTTP; on any disconnect, resumes from the last RV.

    ``connections`` counts streams the apiserver accepted (HTTP 200); ``added`` lists the names
    of ADDED events in arrival order. On a 410 (expired RV) it relists and continues from the
    list's RV, like an informer. The read timeout (30 s) is far above the restart time, so a
    new connection after the restart is caused by the restart.
    """

    def __init__(self, plane: ControlPlane, namespace: str, resource_version: str) -> None:
        super().__init__(daemon=True)
        config = plane.configuration()
        self.pool = urllib3.PoolManager(
            maxsize=2,  # the stream plus a relist
            ca_certs=config.ssl_ca_cert,
            cert_file=config.cert_file,
            key_file=config.key_file,
        )
        self.base = f"{plane.host}/api/v1/namespaces/{namespace}/configmaps"
        self.rv = resource_version
        self.connections = 0
        self.added: list[str] = []
        self.errors: list[str] = []
        self.halt = threading.Event()
        self.response: urllib3.BaseHTTPResponse | None = None

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                self._stream_once()
            except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
                self.errors.append(type(exc).__name__)
            self.halt.wait(0.2)  # reconnect backoff

    def stop(self) -> None:
        """Ask the thread to end and unblock a read in progress."""
        self.halt.set()
        response = self.response
        if response is not None:
            response.shutdown()

    def _stream_once(self) -> None:
        self.response = response = self.pool.request(
            "GET",
            f"{self.base}?watch=1&allowWatchBookmarks=true&resourceVersion={self.rv}",
            preload_content=False,
            timeout=urllib3.Timeout(connect=2.0, read=30.0),
            retries=False,
        )
        try:
            if response.status != 200:
                self.errors.append(f"HTTP {response.status}")
                return
            self.connections += 1
            for line in response:
                if self.halt.is_set():
                    return
                if line.strip():
                    self._handle(json.loads(line))
        finally:
            self.response = None
            response.release_conn()

    def _handle(self, event: dict[str, Any]) -> None:
        obj = event["object"]
        if event["type"] == "ERROR":
            self.errors.append(f"ERROR {obj.get('code')}")
            if obj.get("code") == 410:
                self.rv = json.loads(self.pool.request("GET", self.base).data)["metadata"][
                    "resourceVersion"
                ]
            return
        self.rv = obj["metadata"]["resourceVersion"]
        if event["type"] == "ADDED":
            self.added.append(obj["metadata"]["name"])


def test_watch_reconnects_after_apiserver_restart(
    control_plane: ControlPlane, k8s_api: k8s.ApiClient, namespace: str
) -> None:
    core = k8s.CoreV1Api(k8s_api)
    rv = core.list_namespaced_config_map(namespace).metadata.resource_version
    watcher = RawWatcher(control_plane, namespace, rv)
    watcher.start()
    try:
        wait_for(lambda: watcher.connections >= 1, what="the watch to connect")
        core.create_namespaced_config_map(namespace, configmap("before"))
        wait_for(lambda: "before" in watcher.added, what="ADDED before")

        connections = watcher.connections
        old_pid = control_plane.pids["kube-apiserver"]
        control_plane.restart_apiserver()
        assert control_plane.pids["kube-apiserver"] != old_pid

        # Create ConfigMaps until one arrives as a watch event: one created while the watcher
        # relists after a 410 (expired RV) would reach it through the list, not as an event.
        created: list[tuple[str, float]] = []

        def added_after_restart() -> bool:
            if any(name in watcher.added for name, _ in created):
                return True
            if watcher.connections > connections and (
                not created or time.monotonic() - created[-1][1] > 3.0
            ):
                name = f"after-{len(created)}"
                core.create_namespaced_config_map(namespace, configmap(name))
                created.append((name, time.monotonic()))
            return False

        wait_for(added_after_restart, timeout=60, what="an ADDED event after the restart")
        assert watcher.connections > connections
        ours = [name for name in watcher.added if name == "before" or name.startswith("after-")]
        assert ours[0] == "before"
        print(f"\nwatch: {watcher.connections} connections, errors {watcher.errors}, saw {ours}")
    finally:
        watcher.stop()
        watcher.join(timeout=10)
    assert not watcher.is_alive()


# -- kube-controller-manager -----------------------------------------------------------------


def test_garbage_collector_deletes_orphans(k8s_api: k8s.ApiClient, namespace: str) -> None:
    core = k8s.CoreV1Api(k8s_api)
    owner = core.create_namespaced_config_map(namespace, configmap("owner"))
    reference = k8s.V1OwnerReference(
        api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid
    )
    core.create_namespaced_config_map(namespace, configmap("child", owner_references=[reference]))
    core.delete_namespaced_config_map("owner", namespace)
    wait_for(
        lambda: gone(lambda: core.read_namespaced_config_map("child", namespace)),
        timeout=60,
        what="the garbage collector to delete the child",
    )


def test_deleted_namespace_disappears(k8s_api: k8s.ApiClient, namespace: str) -> None:
    core = k8s.CoreV1Api(k8s_api)
    doomed = f"{namespace[:50]}-doomed"
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=doomed)))
    core.create_namespaced_config_map(doomed, configmap("content"))
    core.delete_namespace(doomed)
    wait_for(
        lambda: gone(lambda: core.read_namespace(doomed)),
        timeout=60,
        what="the namespace controller to finish deleting",
    )


def test_default_service_account_appears(k8s_api: k8s.ApiClient, namespace: str) -> None:
    core = k8s.CoreV1Api(k8s_api)
    wait_for(
        lambda: not gone(lambda: core.read_namespaced_service_account("default", namespace)),
        what="the default ServiceAccount",
    )


# -- etcd --------------------------------------------------------------------------------------


def test_compact_etcd_returns_the_current_revision(
    control_plane: ControlPlane, k8s_api: k8s.ApiClient, namespace: str
) -> None:
    core = k8s.CoreV1Api(k8s_api)
    created = core.create_namespaced_config_map(namespace, configmap("rev"))
    revision = control_plane.compact_etcd()
    assert revision >= int(created.metadata.resource_version)
    core.create_namespaced_config_map(namespace, configmap("rev2"))
    assert control_plane.compact_etcd() > revision


# -- lifecycle ---------------------------------------------------------------------------------


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_exit_leaves_no_process_and_no_directory() -> None:
    with ControlPlane(controller_manager=False) as plane:
        pids = plane.pids
        tmp_dir = Path(plane.tmp_dir)
        assert set(pids) == {"etcd", "kube-apiserver"}
        assert tmp_dir.is_dir() and tmp_dir.name.startswith("declop-cp-")
        assert all(not _process_gone(pid) for pid in pids.values())
    wait_for(lambda: all(map(_process_gone, pids.values())), timeout=5, what=f"{pids} to be gone")
    assert not tmp_dir.exists()
    assert plane.pids == {}
    plane.stop()  # idempotent


def _live_children() -> set[int]:
    """Pids of this process's children that are not zombies (from /proc)."""
    children = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            children.add(int(stat.parent.name))
    return children


def test_interrupted_start_leaves_no_process(mocker: Any) -> None:
    made = mocker.spy(tempfile, "mkdtemp")  # this plane's own dirs (other runs may share /tmp)
    before = _live_children()
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    plane = ControlPlane(controller_manager=False)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            plane.start()
            time.sleep(5)  # only reached if start() was faster than the timer
    finally:
        timer.cancel()
        plane.stop()
    assert plane.startup_seconds is None  # the interrupt landed inside start()
    assert _live_children() <= before
    assert made.spy_return_list and not any(Path(d).exists() for d in made.spy_return_list)


def test_component_that_dies_during_start_is_reported_with_its_log(
    control_plane: ControlPlane, tmp_path: Path, mocker: Any
) -> None:
    for name in ("etcd", "kubectl"):
        (tmp_path / name).symlink_to(control_plane.binary(name))
    fake = tmp_path / "kube-apiserver"
    fake.write_text("#!/bin/sh\necho 'E0101 flag provided but not defined: --boom'\nexit 3\n")
    fake.chmod(0o755)
    before = _live_children()
    made = mocker.spy(tempfile, "mkdtemp")
    plane = ControlPlane(assets_dir=str(tmp_path), controller_manager=False)
    with pytest.raises(RuntimeError, match="kube-apiserver exited with code 3") as info:
        plane.start()
    assert "flag provided but not defined: --boom" in str(info.value)
    assert made.spy_return_list and not any(Path(d).exists() for d in made.spy_return_list)
    assert _live_children() <= before


def test_an_unknown_feature_gate_stops_the_start_with_the_apiservers_words() -> None:
    """A gate the apiserver does not know: it exits at start, and the error quotes its log."""
    before = _live_children()
    plane = ControlPlane(controller_manager=False, feature_gates={"NoSuchGateInDeclopTests": True})
    with pytest.raises(RuntimeError, match="kube-apiserver exited") as info:
        plane.start()
    assert "NoSuchGateInDeclopTests" in str(info.value)
    assert _live_children() <= before


def test_extra_apiserver_flags_are_passed(tmp_path: Path) -> None:
    """An extra flag reaches the apiserver's command line, after declop's own (so it wins)."""
    with ControlPlane(controller_manager=False, apiserver_flags=["--max-requests-inflight=123"]) as plane:
        cmdline = Path(f"/proc/{plane.pids['kube-apiserver']}/cmdline").read_bytes().split(b"\0")
        assert b"--max-requests-inflight=123" in cmdline
        assert cmdline.index(b"--max-requests-inflight=123") > cmdline.index(b"--bind-address=127.0.0.1")


# -- bad input ---------------------------------------------------------------------------------


def test_assets_folder_without_binaries_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path))
    with pytest.raises(ConfigError, match="kube-apiserver") as info:
        find_assets()
    assert "etcd" in str(info.value) and str(tmp_path) in str(info.value)
    with pytest.raises(ConfigError, match="kube-apiserver"):
        ControlPlane().start()


def test_missing_controller_manager_is_a_config_error(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    for name in ("etcd", "kube-apiserver", "kubectl"):
        (tmp_path / name).symlink_to(control_plane.binary(name))
    plane = ControlPlane(assets_dir=str(tmp_path), controller_manager=True)
    with pytest.raises(ConfigError, match="kube-controller-manager"):
        plane.start()
    assert plane.pids == {}


def test_no_assets_anywhere_says_how_to_build_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    monkeypatch.delenv("DECLOP_ASSETS_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(ConfigError, match=r"run `declop assets build`") as info:
        find_assets()
    assert "\n" not in str(info.value)
    assert "KUBEBUILDER_ASSETS" in str(info.value)
