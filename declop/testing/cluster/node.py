"""A real Kubernetes node on this host: containerd + kubelet + kube-proxy + kube-scheduler + CNI.

:class:`Node` joins a running :class:`~declop.testing.ControlPlane` (use
``ControlPlane(node=True)``, which starts and stops it). Pods then really run: images come from
tarballs imported with :meth:`Node.import_image` (there is no registry), the ``kubernetes``
Service reaches the apiserver through kube-proxy, and Pods get projected ServiceAccount tokens.

Guarantees:

- Root is required, and so are containerd, runc, the CNI plugins and iptables (Debian packages;
  ``tools/node/build.sh`` installs them). :meth:`Node.check` raises one ``ConfigError`` naming
  what is missing before anything is touched.
- At most one node runs on a host at a time (a lock file); a second gets ``ConfigError``.
- Before its first change to the host, a node run writes a run record (:mod:`declop.testing.cluster.runrecord`)
  naming what it starts and changes, kept current as it goes; the next run undoes a record whose
  owner was killed before it starts (:mod:`declop.testing.cluster.recovery`).
- All state lives in one private folder. Everything the node changes outside it is recorded when
  it starts and undone by :meth:`Node.stop`: processes (stopped by pid — the ones we started, the
  containerd shims from their ``shim.pid`` files, container processes from our own cgroups —
  never by name), mounts, the cgroup tree, iptables rules and chains, the CNI bridge, sysctls
  (``ip_forward``, the kernel tunables kubelet sets) and the host folders kubelet and containerd
  insist on (``/var/lib/kubelet``, ``/var/log/containers``, ``/var/lib/cni``, ``/run/containerd``).
  :meth:`Node.leftovers` reports anything still there; it is empty after a stop.
- :meth:`Node.start` returns once the Node object is ``Ready`` and kube-proxy has programmed the
  ``kubernetes`` Service; a component that dies or is late raises ``RuntimeError`` with its log.
"""

# size: one piece: the Node class, whose start records every change it makes to the host and whose
# stop undoes exactly those (the guarantees above); each component's flags come from the same
# private folder and claim. Host state is declop.testing.cluster.host, processes declop.testing.cluster.process,
# the lock and the run record declop.testing.cluster.recovery and declop.testing.cluster.runrecord.

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from declop.errors import ConfigError
from declop.testing.cluster import host, recovery
from declop.testing.cluster.host import BRIDGE
from declop.testing.cluster.process import Component, free_ports, launch
from declop.testing.cluster.runrecord import start_time


class Cluster(Protocol):
    """What a node needs of its control plane (:class:`~declop.testing.ControlPlane` has it)."""

    @property
    def client_ca_file(self) -> str: ...

    def add_user(self, name: str, groups: Iterable[str] = ()) -> str: ...

    def request(
        self, method: str, path: str, body: Any = None, timeout: float = 10.0
    ) -> tuple[int, bytes]: ...

__all__ = ["Node", "find_node_assets"]

NODE_BINARIES = ("kubelet", "kube-proxy", "kube-scheduler")
PAUSE_IMAGE = "declop.local/pause:1"
POD_CIDR = "10.244.0.0/24"
CNI_BIN_DIR = "/usr/lib/cni"
# Debian package → a file it provides that the node needs.
PACKAGES = {
    "containerd": "/usr/bin/containerd",
    "runc": "/usr/sbin/runc",
    "containernetworking-plugins": f"{CNI_BIN_DIR}/bridge",
    "iptables": "/usr/sbin/iptables",
    "nftables": "/usr/sbin/nft",
}
NODE_NAME = "declop-node"
START_TIMEOUT = 90.0
POD_GRACE = 3.0


def find_node_assets() -> str:
    """The folder holding kubelet, kube-proxy, kube-scheduler and pause (``tools/node/build.sh``).

    ``$DECLOP_NODE_ASSETS_DIR`` when set, else the newest complete
    ``${XDG_CACHE_HOME:-~/.cache}/declop/node/*``.
    """
    wanted = (*NODE_BINARIES, "pause")
    folder = os.environ.get("DECLOP_NODE_ASSETS_DIR")
    if folder:
        missing = [b for b in wanted if not os.access(Path(folder) / b, os.X_OK)]
        if missing:
            raise ConfigError(
                f"$DECLOP_NODE_ASSETS_DIR ({folder}) lacks {', '.join(missing)}; "
                "run `declop assets build --node`"
            )
        return folder
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "declop" / "node"
    try:
        found = [d for d in root.iterdir() if all(os.access(d / b, os.X_OK) for b in wanted)]
    except OSError:
        found = []
    if not found:
        raise ConfigError(
            f"no node binaries (kubelet, kube-proxy, kube-scheduler, pause) in {root}; "
            "run `declop assets build --node` (needs Go >= 1.26)"
        )
    return str(max(found, key=lambda d: (d / "kubelet").stat().st_mtime))


class Node:
    """One node named ``declop-node`` joined to ``control_plane``; see the module docstring.

    Args:
        control_plane: a ``ControlPlane(node=True)``; it calls :meth:`start` and :meth:`stop`.
        assets_dir: folder with the node binaries; default :func:`find_node_assets`.
        claim: the host, already taken with :func:`declop.testing.cluster.recovery.claim` by the caller
            (the control plane, whose processes the same record names), who releases it after
            :meth:`stop`; by default :meth:`start` takes it and :meth:`stop` releases it.
    """

    def __init__(
        self,
        control_plane: Cluster,
        *,
        assets_dir: str | None = None,
        claim: recovery.Claim | None = None,
    ) -> None:
        self._cp = control_plane
        self._assets_dir = assets_dir
        self.name = NODE_NAME
        self.host_ip = _host_ip()
        self.startup_seconds: float | None = None
        self._dir: Path | None = None
        self._claim = claim
        self._owns_claim = False
        self._procs: dict[str, Component] = {}
        self._host: host.HostState | None = None
        self._cgroup_root = ""
        self._pids: dict[str, int] = {}
        self._last_dir: Path | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def check(self) -> None:
        """Raise ``ConfigError`` (one line) when root, a package or a binary is missing."""
        if os.geteuid() != 0:
            raise ConfigError(
                "a local node needs root (containerd, kubelet and kube-proxy manage mounts, "
                "cgroups and iptables); run as root, or leave the node out (make test-fast)"
            )
        missing = [pkg for pkg, path in PACKAGES.items() if not os.access(path, os.X_OK)]
        if missing:
            raise ConfigError(
                f"a local node needs the Debian packages {' '.join(missing)}; "
                f"run `declop assets build --node` as root (or apt-get install {' '.join(missing)})"
            )
        self.assets_dir  # noqa: B018 - raises ConfigError when the binaries are not built
        if self._claim is None:  # is another node running? (start takes the host)
            recovery.check_free()

    @property
    def assets_dir(self) -> str:
        if self._assets_dir is None:
            self._assets_dir = find_node_assets()
        return self._assets_dir

    def start(self) -> None:
        """Start containerd, kubelet, kube-proxy and the scheduler; return once Ready."""
        if self._dir is not None:
            raise RuntimeError("this Node is already running")
        self.check()
        began = time.monotonic()
        if self._claim is None:
            self._claim, self._owns_claim = recovery.claim(), True
        record = self._claim.record
        try:
            self._host = record.host
            self._dir = record.make_folder("declop-node-")
            self._cgroup_root = f"/declop-{secrets.token_hex(4)}"
            record.set_cgroup_root(self._cgroup_root)
            host.make_cgroups(self._cgroup_root)
            self._start_containerd()
            self.import_image(self._pause_image())
            self._start_kubelet()
            self._start_kube_proxy()
            self._start_scheduler()
            self._wait(self._ready, "the node to become Ready")
            self._wait(self._service_programmed, "kube-proxy to program the kubernetes Service")
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began

    def stop(self) -> None:
        """Stop everything and undo every host change (see the module docstring). Idempotent.

        The run record goes only once all is undone: a stop that fails or is interrupted leaves
        it for the next start (:func:`declop.testing.cluster.recovery.claim`) to finish.
        """
        undone = False
        try:
            for name in ("kube-scheduler", "kube-proxy", "kubelet"):
                if name in self._procs:
                    self._procs.pop(name).stop()
            self._kill_pods()
            if "containerd" in self._procs:
                self._procs.pop("containerd").stop()
            self._kill_shims()
            if self._host is not None:
                self._host.restore(self._dir, self._cgroup_root)
            if self._dir is not None:
                host.unmount_under(self._dir)
                shutil.rmtree(self._dir, ignore_errors=True)
                self._last_dir, self._dir = self._dir, None
            undone = True
        finally:
            if self._owns_claim and self._claim is not None:
                self._claim.release(undone=undone)
                self._claim, self._owns_claim = None, False

    def leftovers(self) -> list[str]:
        """What of this node is still on the host (processes, mounts, chains…); empty after stop.

        Compares the host with what :meth:`start` recorded; call it after :meth:`stop`.
        """
        state = self._host
        if state is None:
            return []
        found = [f"process {pid} ({name})" for name, pid in self._pids.items() if start_time(pid) is not None]
        if self._last_dir or self._dir:
            socket_path = str((self._last_dir or self._dir) / "containerd" / "containerd.sock")  # type: ignore[operator]
            found += [f"containerd-shim {pid}" for pid in _shims_of(socket_path) if start_time(pid) is not None]
        found += [f"container process {pid}" for pid in host.cgroup_pids(self._cgroup_root)]
        private = str(self._last_dir or self._dir or "")
        found += state.difference(private, self._cgroup_root)
        if private and os.path.exists(private):
            found.append(f"folder {private}")
        return found

    # -- using the node --------------------------------------------------------------------

    def import_image(self, tarball: str | os.PathLike[str]) -> None:
        """Import an image tarball (OCI or docker archive) into the node's containerd.

        Pods then use it with ``imagePullPolicy: Never`` or ``IfNotPresent``.
        """
        self._ctr("images", "import", "--no-unpack=false", str(tarball))

    def images(self) -> list[str]:
        """Names of the images the node's containerd holds (namespace ``k8s.io``)."""
        out = self._ctr("images", "list", "--quiet")
        return [line for line in out.splitlines() if line and not line.startswith("sha256:")]

    @property
    def containerd_socket(self) -> str:
        return str(self._workdir() / "containerd" / "containerd.sock")

    @property
    def tmp_dir(self) -> str:
        """The private folder (configs, logs: ``<component>.log``, containerd and kubelet state)."""
        return str(self._workdir())

    # -- components ------------------------------------------------------------------------

    def _start_containerd(self) -> None:
        base = self._workdir() / "containerd"
        cni_conf = self._workdir() / "cni" / "net.d"
        cni_conf.mkdir(parents=True)
        (cni_conf / "10-declop.conflist").write_text(json.dumps(self._cni_config(), indent=2))
        config = base / "config.toml"
        base.mkdir(exist_ok=True)
        config.write_text(_containerd_config(base, cni_conf, self._workdir() / "runc"))
        self._launch("containerd", "/usr/bin/containerd", ["--config", str(config)])
        self._wait(lambda: self._ctr_ok("version"), "containerd to answer")

    def _cni_config(self) -> dict[str, Any]:
        return {
            "cniVersion": "1.0.0",
            "name": "declop",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": True,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_CIDR}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self._workdir() / "cni" / "ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }

    def _start_kubelet(self) -> None:
        work = self._workdir()
        kubeconfig = self._cp.add_user(f"system:node:{self.name}", ["system:nodes"])
        self._kubelet_port, self._kubelet_healthz = free_ports(2)
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": self._cp.client_ca_file},
            },
            "authorization": {"mode": "Webhook"},
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self._cgroup_root,
            "failCgroupV1": False,
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "address": self.host_ip,
            "port": self._kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self._kubelet_healthz,
            "podLogsDir": str(work / "pod-logs"),
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "makeIPTablesUtilChains": False,
            "resolvConf": "/etc/resolv.conf",
            "serializeImagePulls": False,
            "registerNode": True,
            "nodeStatusUpdateFrequency": "4s",
            "shutdownGracePeriod": "0s",
        }
        path = work / "kubelet.yaml"
        path.write_text(json.dumps(config, indent=2))
        self._launch(
            "kubelet",
            self._binary("kubelet"),
            [
                f"--config={path}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={work / 'kubelet'}",
                f"--cert-dir={work / 'kubelet-pki'}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.host_ip}",
                "--v=1",
            ],
        )

    def _start_kube_proxy(self) -> None:
        work = self._workdir()
        kubeconfig = self._cp.add_user("system:kube-proxy")
        metrics, healthz = free_ports(2)
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": kubeconfig},
            "mode": "iptables",
            "clusterCIDR": POD_CIDR,
            "hostnameOverride": self.name,
            "bindAddress": self.host_ip,
            "metricsBindAddress": f"127.0.0.1:{metrics}",
            "healthzBindAddress": f"127.0.0.1:{healthz}",
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
        }
        path = work / "kube-proxy.yaml"
        path.write_text(json.dumps(config, indent=2))
        self._launch("kube-proxy", self._binary("kube-proxy"), [f"--config={path}", "--v=1"])

    def _start_scheduler(self) -> None:
        kubeconfig = self._cp.add_user("system:kube-scheduler")
        self._launch(
            "kube-scheduler",
            self._binary("kube-scheduler"),
            [f"--kubeconfig={kubeconfig}", "--leader-elect=false", "--secure-port=0", "--v=1"],
        )

    def _pause_image(self) -> str:
        from declop.testing.cluster.image import pause_image

        return str(pause_image(self.assets_dir, PAUSE_IMAGE))

    # -- readiness -------------------------------------------------------------------------

    def _ready(self) -> bool:
        status, body = self._cp.request("GET", f"/api/v1/nodes/{self.name}", timeout=2.0)
        if status != 200:
            return False
        conditions = json.loads(body).get("status", {}).get("conditions", [])
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def _service_programmed(self) -> bool:
        saved = subprocess.run(
            ["iptables-save", "-t", "nat"], capture_output=True, text=True, check=False
        ).stdout
        return "default/kubernetes:https cluster IP" in saved or "KUBE-SVC-NPX46M4PTMTKRN6Y" in saved

    def _wait(self, ready: Any, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                if ready():
                    return
            except OSError:
                pass
            for process in self._procs.values():
                if not process.alive():
                    raise RuntimeError(
                        process.describe(f"exited with code {process.popen.returncode}")
                    )
            if time.monotonic() > deadline:
                logs = "\n".join(p.describe("is running") for p in self._procs.values())
                raise RuntimeError(f"timed out after {START_TIMEOUT:g} s waiting for {what}\n{logs}")
            time.sleep(0.2)

    # -- teardown --------------------------------------------------------------------------

    def _kill_pods(self) -> None:
        """SIGTERM every process in our pod cgroups, then SIGKILL what is left after a grace."""
        if not self._cgroup_root:
            return
        pids = host.cgroup_pids(self._cgroup_root)
        for pid in pids:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + POD_GRACE
        while host.cgroup_pids(self._cgroup_root) and time.monotonic() < deadline:
            time.sleep(0.1)
        for _ in range(50):
            left = host.cgroup_pids(self._cgroup_root)
            if not left:
                return
            for pid in left:
                _signal(pid, signal.SIGKILL)
            time.sleep(0.1)

    def _kill_shims(self) -> None:
        """SIGKILL the containerd shims serving our own containerd socket.

        containerd 1.6 records no shim pid: a shim is found by the exact ``-address <our
        socket>`` pair in its command line (the socket's path is unique to this node), which
        also finds a shim whose tasks are gone.
        """
        if self._dir is None:
            return
        for pid in _shims_of(self.containerd_socket):
            self._pids[f"containerd-shim {pid}"] = pid
            _signal(pid, signal.SIGKILL)

    # -- plumbing --------------------------------------------------------------------------

    def _ctr(self, *args: str) -> str:
        result = subprocess.run(
            ["ctr", "--address", self.containerd_socket, "--namespace", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def _ctr_ok(self, *args: str) -> bool:
        try:
            self._ctr(*args)
        except (RuntimeError, subprocess.TimeoutExpired):
            return False
        return True

    def _launch(self, name: str, binary: str, args: list[str]) -> None:
        process = launch(name, [binary, *args], self._workdir())
        self._procs[name] = process
        self._pids[name] = process.popen.pid
        if self._claim is not None:
            self._claim.record.add_process(name, process.popen.pid)

    def _binary(self, name: str) -> str:
        return str(Path(self.assets_dir) / name)

    def _workdir(self) -> Path:
        if self._dir is None:
            raise RuntimeError("the node is not running; call start()")
        return self._dir


def _containerd_config(base: Path, cni_conf: Path, runc_root: Path) -> str:
    cri = '[plugins."io.containerd.grpc.v1.cri"]'
    return f"""version = 2
root = "{base / 'root'}"
state = "{base / 'state'}"
[grpc]
  address = "{base / 'containerd.sock'}"
[ttrpc]
  address = "{base / 'containerd.sock.ttrpc'}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{base / 'opt'}"
{cri}
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
{cri[:-1]}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
{cri[:-1]}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
{cri[:-1]}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = "{runc_root}"
{cri[:-1]}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{cni_conf}"
"""


def _host_ip() -> str:
    """The host's primary IPv4 address: the source address of its default route."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("198.51.100.1", 9))  # UDP connect sends nothing; it only picks a route
        address: str = probe.getsockname()[0]
    except OSError:
        address = "127.0.0.1"
    finally:
        probe.close()
    if address.startswith("127."):
        raise ConfigError("a local node needs a non-loopback IPv4 address with a default route")
    return address


def _shims_of(socket_path: str) -> list[int]:
    """Pids of the processes started with ``-address <socket_path>`` (containerd shims)."""
    wanted = ["-address", socket_path]
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(argv[i : i + 2] == wanted for i in range(len(argv) - 1)):
            found.append(int(entry.name))
    return found


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


