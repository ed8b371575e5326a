"""A real Kubernetes control plane for tests: etcd + kube-apiserver (+ kube-controller-manager).

``ControlPlane`` runs the upstream binaries (built by ``declop assets build``, found by
:func:`find_assets`: :func:`declop.assets.find`) on loopback ports, with generated certificates and an admin kubeconfig::

    with ControlPlane() as cp:
        subprocess.run(["kubectl", "get", "ns"], env=cp.env(), check=True)
        api = kubernetes.client.CoreV1Api(cp.api_client())

Guarantees:

- When :meth:`ControlPlane.start` returns, etcd reports ``/health`` true, the apiserver's
  ``/readyz`` answers ``ok`` to the admin client, and (with ``controller_manager=True``) the
  controller-manager is running and has created the ``default`` ServiceAccount in ``default``.
- Everything listens on 127.0.0.1 only — except with ``node=True``, where the apiserver listens on
  every address and advertises the host's primary IP so that Pods reach it (see
  :mod:`declop.testing.cluster.node`), ServiceAccount admission is on and a real node runs. Authentication is real (x509 client certs, ServiceAccount
  tokens) and so is authorization (``Node,RBAC``); the admin is in ``system:masters``.
- Every process runs in its own session and is stopped by its pid only: SIGTERM to its process
  group, up to 10 s, then SIGKILL. Nothing is ever killed by name.
- :meth:`ControlPlane.stop` is idempotent, also runs at interpreter exit and after a failed or
  interrupted start, and removes the temporary directory (certs, etcd data, logs).
- A component that dies or does not get ready in time raises ``RuntimeError`` naming the
  component and quoting the last lines of its log; a missing binary raises ``ConfigError``.
- Extra apiserver flags (``apiserver_flags``) come after declop's own, so a flag given there wins
  (the apiserver's flag parser keeps the last value); ``feature_gates`` become one
  ``--feature-gates`` flag, as envtest's ``APIServer.Configure().Append("feature-gates", …)``
  does. Both are checked before anything starts: a flag that does not start with ``--``, a
  ``--feature-gates`` flag next to ``feature_gates``, or a gate value that is not a bool raise
  ``ValueError``; a gate this apiserver does not know makes it exit at start (``RuntimeError``
  quoting its log).
"""

# size: one piece: the ControlPlane class, whose start, restart and stop order the guarantees
# above; the flags of each component are built from the same certificates, ports and folders it
# owns. Certificates are declop.testing.cluster.certs, processes declop.testing.cluster.process.

from __future__ import annotations

import atexit
import base64
import http.client
import json
import os
import shutil
import ssl
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import kubernetes.client

from declop import assets as assets_module
from declop.errors import ApiError, ConfigError
from declop.testing.cluster.certs import Certificates, KeyPair, generate
from declop.testing.cluster.process import Component, free_ports, launch

if TYPE_CHECKING:
    from declop.testing.cluster.node import Node
    from declop.testing.cluster.recovery import Claim

__all__ = ["ControlPlane", "find_assets"]

REQUIRED_BINARIES = assets_module.REQUIRED_BINARIES
CONTROLLER_MANAGER = "kube-controller-manager"
ETCD = "etcd"
APISERVER = "kube-apiserver"
STOP_TIMEOUT = 10.0
POLL_INTERVAL = 0.1
LOG_TAIL_LINES = 20
PORT_ATTEMPTS = 3
# The names the apiserver is known by inside the cluster: the first IP of --service-cluster-ip-range
# (the ``kubernetes`` Service) and its DNS names.
_SERVICE_HOSTS = (
    "10.0.0.1",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
_STOP_ORDER = {CONTROLLER_MANAGER: 0, APISERVER: 1, ETCD: 2}


def find_assets() -> str:
    """Return the directory holding kube-apiserver, etcd and kubectl: :func:`declop.assets.find`.

    Looks at, in order: ``$KUBEBUILDER_ASSETS``, ``$DECLOP_ASSETS_DIR`` (each, when set, must hold
    all three), then this declop's cache folder, then the newest complete
    ``${XDG_CACHE_HOME:-~/.cache}/declop/controlplane/*``. kube-controller-manager and helm are
    optional here.

    Raises:
        ConfigError: a named folder lacks a binary, or nothing was found at all (the message says
            to run ``declop assets build``).
    """
    return assets_module.find()


class ControlPlane:
    """etcd + kube-apiserver (+ kube-controller-manager) on loopback; see the module docstring.

    Args:
        assets_dir: folder with the binaries; default :func:`find_assets`.
        controller_manager: also run kube-controller-manager (garbage collector, namespace
            deletion, default ServiceAccounts, …).
        start_timeout: seconds each component may take to become ready.
        node: also run a real node (containerd, kubelet, kube-proxy, kube-scheduler; needs root,
            see :class:`declop.testing.cluster.node.Node`) and serve the apiserver to its Pods. Implies
            ``controller_manager=True``.
        apiserver_flags: extra kube-apiserver flags (``"--flag=value"``), after declop's own.
        feature_gates: kube-apiserver feature gates, e.g. ``{"ShardedListAndWatch": True}``.
    """

    def __init__(
        self,
        *,
        assets_dir: str | None = None,
        controller_manager: bool = True,
        start_timeout: float = 60.0,
        node: bool = False,
        apiserver_flags: Iterable[str] = (),
        feature_gates: Mapping[str, bool] | None = None,
    ) -> None:
        self.apiserver_flags: tuple[str, ...] = _check_flags(apiserver_flags)
        self.feature_gates: dict[str, bool] = _check_gates(feature_gates or {}, self.apiserver_flags)
        self._assets_dir = assets_dir
        self.controller_manager = controller_manager or node
        self.with_node = node
        self.node: Node | None = None
        self._host_ip = "127.0.0.1"
        self.start_timeout = start_timeout
        self.startup_seconds: float | None = None
        self._dir: Path | None = None
        self._certs: Certificates | None = None
        self._ports: dict[str, int] = {}
        self._procs: dict[str, Component] = {}
        self._ssl: ssl.SSLContext | None = None
        self._claim: Claim | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start every component and wait until each is ready (see the module guarantees)."""
        if self._dir is not None:
            raise RuntimeError("this ControlPlane is already running")
        began = time.monotonic()
        assets = self.assets_dir
        assets_module.require(assets, "the assets folder")
        if self.controller_manager and assets_module.missing(assets, [CONTROLLER_MANAGER]):
            raise ConfigError(
                f"{CONTROLLER_MANAGER} is not in {assets}; run `declop assets build`, or "
                "pass controller_manager=False (DECLOP_TEST_NO_CONTROLLER_MANAGER=1 in pytest)"
            )
        node = None
        if self.with_node:
            from declop.testing.cluster.node import Node

            node = Node(self)
            node.check()  # no root, no packages: one clear error before anything starts
            self._host_ip = node.host_ip
        atexit.register(self.stop)
        try:
            if node is not None:
                from declop.testing.cluster import recovery

                # the host: another node refused, a killed one cleaned up, then our run record
                self._claim = recovery.claim()
                node = Node(self, claim=self._claim)
            if self._claim is not None:  # recorded before it is made, as each process it runs
                self._dir = self._claim.record.make_folder("declop-cp-")
            else:
                self._dir = Path(tempfile.mkdtemp(prefix="declop-cp-"))
            hosts = [self._host_ip, *_SERVICE_HOSTS] if node is not None else []
            self._certs = generate(self._dir / "certs", hosts)
            self._start_etcd_and_apiserver()
            self._write_kubeconfig(self.kubeconfig_path, self._certs.admin, "admin")
            if self.controller_manager:
                self._start_controller_manager()
            if node is not None:
                self.node = node
                node.start()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began

    def stop(self) -> None:
        """Stop every process (by pid) and delete the temporary directory. Idempotent.

        With a node, the node goes first and undoes every host change it made; the run record
        goes last, once everything is undone (an interrupted stop leaves it to the next start).
        """
        undone = False
        try:
            if self.node is not None:
                self.node.stop()
                self.node = None
            self._stop_processes()
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None
            undone = True
        finally:
            self._ssl = None
            atexit.unregister(self.stop)
            if self._claim is not None:
                self._claim.release(undone=undone)
                self._claim = None

    def stop_apiserver(self) -> None:
        """Stop kube-apiserver only (etcd and its data stay); :meth:`start_apiserver` brings it back."""
        process = self._procs.get(APISERVER)
        if process is not None:
            process.stop()
            del self._procs[APISERVER]

    def start_apiserver(self) -> None:
        """Start kube-apiserver again on the same port, certs and etcd; wait until it is ready."""
        if APISERVER in self._procs:
            raise RuntimeError("kube-apiserver is already running")
        try:
            self._launch_and_wait(APISERVER, self._apiserver_args(), self._apiserver_ready)
        except BaseException:
            self.stop_apiserver()
            raise

    def restart_apiserver(self) -> None:
        """Stop kube-apiserver (SIGTERM, then SIGKILL) and start it again; wait until ready."""
        self.stop_apiserver()
        self.start_apiserver()

    # -- facts about the running control plane ---------------------------------------------

    @property
    def assets_dir(self) -> str:
        """The folder the binaries come from (resolved by :func:`find_assets` if not given)."""
        if self._assets_dir is None:
            self._assets_dir = find_assets()
        return self._assets_dir

    @property
    def host(self) -> str:
        """The apiserver URL, ``https://127.0.0.1:<port>``."""
        return f"https://127.0.0.1:{self._port(APISERVER)}"

    @property
    def client_ca_file(self) -> str:
        """Path of the CA the apiserver (and a node's kubelet) trusts for client certificates."""
        return self._certificates().client_ca.cert

    @property
    def kubeconfig_path(self) -> str:
        """Path of the admin kubeconfig (context ``declop``, user ``admin`` in system:masters)."""
        return str(self._workdir() / "admin.kubeconfig")

    @property
    def ca_file(self) -> str:
        """Path of the CA that signed the apiserver's serving certificate."""
        return self._certificates().serving_ca.cert

    @property
    def pids(self) -> dict[str, int]:
        """Component name → pid, for the processes that are still alive."""
        return {name: p.popen.pid for name, p in self._procs.items() if p.alive()}

    @property
    def tmp_dir(self) -> str:
        """The temporary directory holding certs, etcd data and ``<component>.log`` files."""
        return str(self._workdir())

    def binary(self, name: str) -> str:
        """Path of binary ``name`` in the assets folder; ``ConfigError`` if it is not there."""
        assets_module.require(self.assets_dir, "the assets folder", [name])
        return str(Path(self.assets_dir) / name)

    def env(self) -> dict[str, str]:
        """A copy of ``os.environ`` with ``KUBECONFIG`` set and the assets folder first on PATH."""
        env = dict(os.environ)
        env["KUBECONFIG"] = self.kubeconfig_path
        env["PATH"] = os.pathsep.join(filter(None, [self.assets_dir, env.get("PATH")]))
        return env

    def configuration(self) -> kubernetes.client.Configuration:
        """A new admin ``kubernetes.client.Configuration`` (nothing shared between calls)."""
        admin = self._certificates().admin
        return kubernetes.client.Configuration(
            host=self.host, ssl_ca_cert=self.ca_file, cert_file=admin.cert, key_file=admin.key
        )

    def api_client(self) -> kubernetes.client.ApiClient:
        """A new ``ApiClient`` on :meth:`configuration`; the caller closes it."""
        return kubernetes.client.ApiClient(self.configuration())

    # -- helpers for tests -----------------------------------------------------------------

    def add_user(self, name: str, groups: Iterable[str] = ()) -> str:
        """Issue a client cert for ``name`` in ``groups`` and return a kubeconfig path for it.

        The user has no permissions until RBAC grants some (unless a group is system:masters).
        """
        pair = self._certificates().issue_client(name, groups)
        path = Path(pair.cert).with_suffix(".kubeconfig")
        self._write_kubeconfig(str(path), pair, name)
        return str(path)

    def service_account_token(
        self, namespace: str, name: str, expiration_seconds: int = 3600
    ) -> str:
        """A bound token for ServiceAccount ``namespace/name`` from the TokenRequest API.

        The apiserver rejects ``expiration_seconds`` below 600. Raises ``ApiError`` on non-201.
        """
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": expiration_seconds},
        }
        status, data = self._apiserver_request("POST", path, body)
        if status != 201:
            raise ApiError(
                status, http.client.responses.get(status, ""), data.decode(errors="replace")
            )
        token: str = json.loads(data)["status"]["token"]
        return token

    def compact_etcd(self) -> int:
        """Compact etcd (physically) up to its current revision; return that revision.

        Afterwards etcd has no history before that revision, so a read of an older
        resourceVersion that reaches etcd gets 410 Gone. Compacting twice without writes in
        between is fine.
        """
        status = self._etcd_post("/v3/maintenance/status", {})
        revision = int(status["header"]["revision"])
        try:
            self._etcd_post("/v3/kv/compaction", {"revision": revision, "physical": True})
        except urllib.error.HTTPError as exc:
            if b"compacted" not in exc.read():  # already compacted up to here: nothing to do
                raise
        return revision

    # -- starting components ---------------------------------------------------------------

    def _start_etcd_and_apiserver(self) -> None:
        """Pick free ports and start etcd then the apiserver; retry if another process took a port."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            etcd_client, etcd_peer, apiserver = free_ports(3)
            self._ports = {ETCD: etcd_client, "etcd-peer": etcd_peer, APISERVER: apiserver}
            try:
                self._launch_and_wait(ETCD, self._etcd_args(), self._etcd_healthy)
                self._launch_and_wait(APISERVER, self._apiserver_args(), self._apiserver_ready)
                return
            except _PortTaken:
                self._stop_processes()
                shutil.rmtree(self._workdir() / "etcd", ignore_errors=True)
                if attempt == PORT_ATTEMPTS:
                    raise

    def _start_controller_manager(self) -> None:
        self._write_kubeconfig(
            str(self._workdir() / "controller-manager.kubeconfig"),
            self._certificates().admin,
            "admin",
        )
        self._launch_and_wait(
            CONTROLLER_MANAGER, self._controller_manager_args(), self._controllers_running
        )

    def _stop_processes(self) -> None:
        """Stop every process, clients first and etcd last, one at a time.

        One at a time, because kube-apiserver removes its leases from etcd on exit and hangs for
        seconds when etcd is already gone. A process leaves ``_procs`` only once it is reaped, so
        an interrupted stop can be repeated.
        """
        for name in sorted(self._procs, key=lambda n: _STOP_ORDER.get(n, -1)):
            self._procs[name].stop()
            del self._procs[name]

    def _launch_and_wait(self, name: str, args: list[str], ready: Callable[[], bool]) -> None:
        """Start ``name`` with ``args`` and poll ``ready`` until true, the process dies, or timeout."""
        process = self._launch(name, args)
        deadline = time.monotonic() + self.start_timeout
        while not ready():
            if not process.alive():
                failure = f"exited with code {process.popen.returncode} while starting"
                error = _PortTaken if "address already in use" in process.tail() else RuntimeError
                raise error(process.describe(failure))
            if time.monotonic() > deadline:
                raise RuntimeError(
                    process.describe(f"was not ready after {self.start_timeout:g} s")
                )
            time.sleep(POLL_INTERVAL)

    def _launch(self, name: str, args: list[str]) -> Component:
        process = launch(name, [self.binary(name), *args], self._workdir())
        self._procs[name] = process
        if self._claim is not None:
            self._claim.record.add_process(name, process.popen.pid)
        return process

    def _etcd_args(self) -> list[str]:
        client = f"http://127.0.0.1:{self._port(ETCD)}"
        peer = f"http://127.0.0.1:{self._port('etcd-peer')}"
        return [
            f"--data-dir={self._workdir() / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ]

    def _apiserver_args(self) -> list[str]:
        certs = self._certificates()
        issuer = f"https://127.0.0.1:{self._port(APISERVER)}"
        if self.with_node:
            return [
                *self._common_apiserver_args(certs, issuer),
                *self._node_apiserver_args(certs),
                *self._extra_apiserver_args(),
            ]
        return [
            *self._common_apiserver_args(certs, issuer),
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            "--disable-admission-plugins=ServiceAccount",
            *self._extra_apiserver_args(),
        ]

    def _extra_apiserver_args(self) -> list[str]:
        gates = ",".join(f"{name}={str(on).lower()}" for name, on in sorted(self.feature_gates.items()))
        return [*([f"--feature-gates={gates}"] if gates else []), *self.apiserver_flags]

    def _node_apiserver_args(self, certs: Certificates) -> list[str]:
        """Reachable from Pods (every address, the host IP advertised), as a real cluster admits."""
        kubelet_client = certs.issue_client("kube-apiserver-kubelet-client", ["system:masters"])
        return [
            "--bind-address=0.0.0.0",
            f"--advertise-address={self._host_ip}",
            "--enable-admission-plugins=NodeRestriction",
            f"--kubelet-client-certificate={kubelet_client.cert}",
            f"--kubelet-client-key={kubelet_client.key}",
            "--kubelet-preferred-address-types=InternalIP",
        ]

    def _common_apiserver_args(self, certs: Certificates, issuer: str) -> list[str]:
        return [
            f"--etcd-servers=http://127.0.0.1:{self._port(ETCD)}",
            f"--secure-port={self._port(APISERVER)}",
            f"--tls-cert-file={certs.apiserver.cert}",
            f"--tls-private-key-file={certs.apiserver.key}",
            f"--client-ca-file={certs.client_ca.cert}",
            "--authorization-mode=Node,RBAC",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--allow-privileged=true",
            f"--service-account-issuer={issuer}",
            f"--api-audiences={issuer}",
            f"--service-account-key-file={certs.sa_public_key}",
            f"--service-account-signing-key-file={certs.sa_private_key}",
            # End open watches at once on SIGTERM; otherwise shutdown waits for them for 60 s.
            "--shutdown-watch-termination-grace-period=1s",
        ]

    def _controller_manager_args(self) -> list[str]:
        certs = self._certificates()
        return [
            f"--kubeconfig={self._workdir() / 'controller-manager.kubeconfig'}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            "--secure-port=0",
            "--controllers=*",
            "--use-service-account-credentials=false",
            f"--service-account-private-key-file={certs.sa_private_key}",
            f"--root-ca-file={certs.serving_ca.cert}",
            "--kube-api-qps=100",
            "--kube-api-burst=200",
        ]

    # -- readiness probes (each returns False while not ready, never raises) ----------------

    def _etcd_healthy(self) -> bool:
        url = f"http://127.0.0.1:{self._port(ETCD)}/health"
        try:
            with urllib.request.urlopen(url, timeout=1.0) as response:
                return bool(json.load(response).get("health") == "true")
        except (OSError, ValueError):
            return False

    def _apiserver_ready(self) -> bool:
        try:
            status, body = self._apiserver_request("GET", "/readyz", timeout=2.0)
        except (OSError, http.client.HTTPException):
            return False
        return status == 200 and body.strip() == b"ok"

    def _controllers_running(self) -> bool:
        """True once the ServiceAccount controller created ``default/default``."""
        try:
            status, _ = self._apiserver_request(
                "GET", "/api/v1/namespaces/default/serviceaccounts/default", timeout=2.0
            )
        except (OSError, http.client.HTTPException):
            return False
        return status == 200

    # -- plumbing --------------------------------------------------------------------------

    def request(
        self, method: str, path: str, body: Any = None, timeout: float = 10.0
    ) -> tuple[int, bytes]:
        """One admin request to the apiserver (JSON ``body``); returns (status, body) for any status."""
        return self._apiserver_request(method, path, body, timeout)

    def _apiserver_request(
        self, method: str, path: str, body: Any = None, timeout: float = 10.0
    ) -> tuple[int, bytes]:
        conn = http.client.HTTPSConnection(
            "127.0.0.1", self._port(APISERVER), context=self._ssl_context(), timeout=timeout
        )
        try:
            payload = None if body is None else json.dumps(body).encode()
            headers = {"Accept": "application/json", "Content-Type": "application/json"}
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def _etcd_post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self._port(ETCD)}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10.0) as response:
            result: dict[str, Any] = json.load(response)
        return result

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            certs = self._certificates()
            context = ssl.create_default_context(cafile=certs.serving_ca.cert)
            context.load_cert_chain(certs.admin.cert, certs.admin.key)
            self._ssl = context
        return self._ssl

    def _write_kubeconfig(self, path: str, pair: KeyPair, user: str) -> None:
        """Write a kubeconfig (JSON, which is YAML) with the certs embedded; mode 0600."""

        def data(file: str) -> str:
            return base64.b64encode(Path(file).read_bytes()).decode()

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "declop",
                    "cluster": {
                        "server": self.host,
                        "certificate-authority-data": data(self.ca_file),
                    },
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate-data": data(pair.cert),
                        "client-key-data": data(pair.key),
                    },
                }
            ],
            "contexts": [{"name": "declop", "context": {"cluster": "declop", "user": user}}],
            "current-context": "declop",
        }
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(config, f, indent=2)

    def _workdir(self) -> Path:
        if self._dir is None:
            raise RuntimeError("the control plane is not running; call start() or use `with`")
        return self._dir

    def _certificates(self) -> Certificates:
        self._workdir()
        assert self._certs is not None
        return self._certs

    def _port(self, name: str) -> int:
        self._workdir()
        return self._ports[name]


def _check_flags(flags: Iterable[str]) -> tuple[str, ...]:
    if isinstance(flags, str):
        raise ValueError(f"apiserver_flags must be a list of flags, not the string {flags!r}")
    out = tuple(flags)
    for flag in out:
        if not isinstance(flag, str) or not flag.startswith("--"):
            raise ValueError(f"apiserver flag {flag!r} must start with '--' (e.g. '--v=2')")
    return out


def _check_gates(gates: Mapping[str, bool], flags: tuple[str, ...]) -> dict[str, bool]:
    for name, on in gates.items():
        if not isinstance(on, bool) or not isinstance(name, str) or not name:
            raise ValueError(f"feature gate {name!r}={on!r}: give a gate name and True or False")
    if gates and any(f.startswith("--feature-gates") for f in flags):
        raise ValueError("give feature gates either as feature_gates or as a --feature-gates flag, not both")
    return dict(gates)


class _PortTaken(RuntimeError):
    """A component died because its port was taken between picking and binding it."""
