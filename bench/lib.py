"""Building blocks of the benchmark harness: the control plane with an audit log, the operators
under test as processes, the reconcile-log tailer, the load generator, and the measurements.

Nothing here edits declop: operators are separate processes, the control plane is declop's
``ControlPlane`` with three extra apiserver flags (an audit log of the operators' requests).
"""

from __future__ import annotations

import bisect
import gzip
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from declop.testing import ControlPlane

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
OPS = BENCH / "ops"
KOPF_VENV = BENCH / ".venv-kopf"
GO_BASELINE = BENCH / "baseline-go"
LOADGEN = BENCH / "loadgen"
OPERATOR_GROUP = "bench-operators"

AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  userGroups: ["%s"]
- level: None
""" % OPERATOR_GROUP

_T0 = time.monotonic()


def progress(msg: str) -> None:
    """One progress line on stderr with the harness's elapsed time."""
    print(f"[{time.monotonic() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ control plane


class BenchControlPlane(ControlPlane):
    """declop's ControlPlane plus an apiserver audit log (Metadata level) of the operators' users.

    The audit log is how requests are counted per operator, user agent and verb: kube-apiserver's
    ``apiserver_request_total`` has no user or user-agent label (checked on v1.36.3, see README).
    """

    def _etcd_args(self) -> list[str]:
        # A full `make bench` writes ~2 GiB of revisions (100k objects of ~6.7 KB kept for the whole run,
        # plus every churn window's updates): compaction makes that space reusable but never shrinks the
        # file, and etcd's default 2 GiB quota then refuses every write ("mvcc: database space exceeded").
        return [*super()._etcd_args(), f"--quota-backend-bytes={8 * 1024 ** 3}"]

    def _apiserver_args(self) -> list[str]:
        work = Path(self.tmp_dir)
        policy = work / "audit-policy.yaml"
        policy.write_text(AUDIT_POLICY)
        return [
            *super()._apiserver_args(),
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.audit_log_path}",
            "--audit-log-maxsize=0",  # no rotation: the harness reads one file
            "--audit-log-format=json",
        ]

    @property
    def audit_log_path(self) -> str:
        return str(Path(self.tmp_dir) / "audit.log")

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                timeout: float = 60.0) -> tuple[int, bytes]:
        conn = http.client.HTTPSConnection("127.0.0.1", int(self.host.rsplit(":", 1)[1]),
                                           context=self._ssl_context(), timeout=timeout)
        try:
            payload = None if body is None else json.dumps(body).encode()
            conn.request(method, path, body=payload, headers={"Accept": "application/json",
                                                              "Content-Type": content_type})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def json(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
             ok: Iterable[int] = (200, 201, 202)) -> Any:
        status, data = self.request(method, path, body, content_type)
        if status not in tuple(ok):
            raise RuntimeError(f"{method} {path}: {status} {data[:300]!r}")
        return json.loads(data) if data else None

    def metrics_text(self) -> str:
        status, data = self.request("GET", "/metrics")
        return data.decode() if status == 200 else ""


# ------------------------------------------------------------------------------ resources


@dataclass(frozen=True)
class Resource:
    """What the scenarios write and the operators reconcile: ConfigMaps, or the CRD variant."""

    name: str  # for operators: configmaps | widgets.bench.declop.dev
    api_prefix: str  # api/v1 | apis/bench.declop.dev/v1
    plural: str
    api_version: str
    kind: str
    go_gvk: str = ""  # Kind.version.group for the Go baseline (empty: ConfigMaps)

    def collection(self, ns: str) -> str:
        return f"/{self.api_prefix}/namespaces/{ns}/{self.plural}"


CONFIGMAPS = Resource("configmaps", "api/v1", "configmaps", "v1", "ConfigMap")
WIDGETS = Resource("widgets.bench.declop.dev", "apis/bench.declop.dev/v1", "widgets",
                   "bench.declop.dev/v1", "Widget", "Widget.v1.bench.declop.dev")

WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.bench.declop.dev"},
    "spec": {
        "group": "bench.declop.dev",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
        "versions": [{
            "name": "v1", "served": True, "storage": True,
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            }}},
        }],
    },
}


def install_crd(cp: BenchControlPlane) -> None:
    cp.json("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", WIDGET_CRD, ok=(201, 409))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        crd = cp.json("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.bench.declop.dev")
        conds = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
        if conds.get("Established") == "True":
            status, _ = cp.request("GET", "/apis/bench.declop.dev/v1/widgets")
            if status == 200:
                return
        time.sleep(0.2)
    raise RuntimeError("the Widget CRD was not established in 60 s")


# ------------------------------------------------------------------------------ builds


def _newer(target: Path, sources: Iterable[Path]) -> bool:
    return target.exists() and all(target.stat().st_mtime >= s.stat().st_mtime for s in sources)


def go_build(folder: Path, binary: str) -> Path:
    """``go build`` a module of bench/ into a gitignored binary, unless it is up to date."""
    out = folder / binary
    sources = [p for p in folder.iterdir() if p.suffix == ".go" or p.name in ("go.mod", "go.sum")]
    if not _newer(out, sources):
        progress(f"building {folder.relative_to(REPO)} with go build (first time: ~2-3 min)…")
        subprocess.run(["go", "build", "-o", binary, "."], cwd=folder, check=True,
                       env={**os.environ, "GOFLAGS": "-mod=mod"})
    return out


def kopf_venv() -> Path:
    """bench/.venv-kopf with the latest Kopf from PyPI (never a dependency of declop)."""
    kopf = KOPF_VENV / "bin" / "kopf"
    if not kopf.exists():
        progress("creating bench/.venv-kopf and installing kopf (latest) from PyPI…")
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(KOPF_VENV)], check=True)
        subprocess.run([str(KOPF_VENV / "bin" / "pip"), "install", "-q", "--upgrade", "kopf"], check=True)
    return kopf


def kopf_version() -> str:
    if not (KOPF_VENV / "bin" / "python").exists():  # no Kopf column in this run
        return "not installed"
    out = subprocess.run([str(KOPF_VENV / "bin" / "python"), "-c",
                          "import importlib.metadata as m; print(m.version('kopf'))"],
                         capture_output=True, text=True)
    return out.stdout.strip() or "?"


# ------------------------------------------------------------------------------ operators


@dataclass
class OperatorSpec:
    name: str  # short id used in file names and columns
    label: str  # column title
    kind: str  # declop | declop-inproc | kopf | go
    env: dict[str, str] = field(default_factory=dict)
    aux: bool = False  # auxiliary (probe) operator: only some scenarios

    def argv(self, ns: str, kubeconfig: str) -> list[str]:
        if self.kind == "declop":
            return [sys.executable, "-m", "declop", "run", str(OPS / "declop_noop.py"), "-n", ns,
                    "--kubeconfig", kubeconfig]
        if self.kind == "declop-inproc":
            return [sys.executable, str(OPS / "declop_inproc.py"), ns, kubeconfig]
        if self.kind == "kopf":
            return [str(KOPF_VENV / "bin" / "kopf"), "run", "--standalone", "-n", ns,
                    str(OPS / "kopf_noop.py")]
        if self.kind == "go":
            return [str(GO_BASELINE / "baseline"), "--kubeconfig", kubeconfig, "--namespace", ns,
                    "--user-agent", "bench-controller-runtime"]
        raise ValueError(self.kind)


OPERATORS = {
    "declop": OperatorSpec("declop", "declop", "declop"),
    "declop-paged": OperatorSpec("declop-paged", "declop, paged lists", "declop", {"DECLOP_LIST_MODE": "paged"}),
    "kopf-event": OperatorSpec("kopf-event", "Kopf on.event", "kopf", {"BENCH_KOPF_MODE": "event"}),
    "kopf-event-nopost": OperatorSpec("kopf-event-nopost", "Kopf on.event, no posting", "kopf",
                                      {"BENCH_KOPF_MODE": "event", "BENCH_KOPF_POSTING": "0"}),
    "kopf-cu": OperatorSpec("kopf-cu", "Kopf on.create/update", "kopf", {"BENCH_KOPF_MODE": "cu"}),
    "kopf-cu-nopost": OperatorSpec("kopf-cu-nopost", "Kopf on.create/update, no posting", "kopf",
                                   {"BENCH_KOPF_MODE": "cu", "BENCH_KOPF_POSTING": "0"}),
    "controller-runtime": OperatorSpec("controller-runtime", "controller-runtime", "go"),
    # the same binary reading JSON, as declop does (it asks for protobuf for built-in kinds)
    "controller-runtime-json": OperatorSpec("controller-runtime-json", "controller-runtime, JSON", "go",
                                            {"BENCH_CR_CONTENT_TYPE": "json"}),
    "declop-inproc": OperatorSpec("declop-inproc", "declop (in-process probes)", "declop-inproc", aux=True),
    "declop-inproc-paged": OperatorSpec("declop-inproc-paged", "declop, paged lists (in-process probes)",
                                        "declop-inproc", {"DECLOP_LIST_MODE": "paged"}, aux=True),
}


class ReconcileLog:
    """Tails an operator's reconcile log: lines ``<t_ns> <ns>/<name> <seq>``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: list[tuple[int, str, str]] = []
        self._pos = 0
        self._partial = b""

    def poll(self) -> int:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._pos)
                data = f.read()
        except FileNotFoundError:
            return 0
        if not data:
            return 0
        self._pos += len(data)
        data = self._partial + data
        *complete, self._partial = data.split(b"\n")
        for raw in complete:
            parts = raw.decode().split(" ")
            if len(parts) == 3:
                self.lines.append((int(parts[0]), parts[1], parts[2]))
        return len(complete)

    def since(self, t_ns: int) -> list[tuple[int, str, str]]:
        return [x for x in self.lines if x[0] >= t_ns]


class OperatorProcess:
    """One operator under test, started in its own session; stopped by its pid only."""

    def __init__(self, spec: OperatorSpec, ns: str, kubeconfig: str, workdir: Path, resource: Resource,
                 extra_env: dict[str, str] | None = None) -> None:
        self.spec = spec
        self.ns = ns
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.out = workdir / "reconciles.log"
        self.stall_out = workdir / "stall.log"
        self.recv_out = workdir / "received.log"
        for p in (self.out, self.stall_out, self.recv_out):
            p.unlink(missing_ok=True)
        env = dict(os.environ)
        env.pop("VIRTUAL_ENV", None)
        env.update(spec.env)
        env.update(extra_env or {})
        env.update({"BENCH_OUT": str(self.out), "KUBECONFIG": kubeconfig, "BENCH_RESOURCE": resource.name,
                    "PYTHONDONTWRITEBYTECODE": "0"})
        if spec.kind in ("kopf", "declop-inproc"):
            env["BENCH_STALL_OUT"] = str(self.stall_out)
        if spec.kind == "declop-inproc":
            env["BENCH_RECV_OUT"] = str(self.recv_out)
        argv = spec.argv(ns, kubeconfig)
        if spec.kind == "go":
            argv += ["--out", str(self.out)]
            if resource.go_gvk:
                argv += ["--gvk", resource.go_gvk]
        self.log = ReconcileLog(self.out)
        self.churned: list[tuple[float, list[Write], float]] = []  # bench/run.py: the probe's churn windows
        self._stdout = open(workdir / "operator.log", "wb")
        self.t_exec = time.time_ns()
        self.popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._stdout,
                                      stderr=subprocess.STDOUT, env=env, cwd=str(REPO),
                                      start_new_session=True)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def rss_kib(self) -> tuple[int, int]:
        """(VmRSS, VmHWM) in KiB from /proc/<pid>/status."""
        rss = hwm = 0
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith("VmHWM:"):
                    hwm = int(line.split()[1])
        return rss, hwm

    def cpu_seconds(self) -> float:
        """utime + stime of the process (all threads), from /proc/<pid>/stat."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self, timeout: float = 15.0) -> None:
        if self.alive():
            try:
                os.killpg(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.pid, signal.SIGKILL)
                self.popen.wait()
        self._stdout.close()
        self.log.poll()

    def tail(self, n: int = 15) -> str:
        try:
            return "\n".join((self.workdir / "operator.log").read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def max_stall_ms(self, t_from: int, t_to: int) -> float | None:
        """Largest event-loop lateness the in-process probe logged in [t_from, t_to]."""
        worst = self.worst_stall(t_from, t_to)
        return None if worst is None else worst["max_stall_ms"]

    def worst_stall(self, t_from: int, t_to: int) -> dict[str, float | None] | None:
        """The longest late tick the probe logged in [t_from, t_to]: its lateness and, over that
        tick, the loop thread's and the whole process's CPU (ms; None from a probe that did not
        log them). CPU near the lateness: the loop was working; far below it: the process was
        not scheduled (a busy machine). None: no probe ran."""
        try:
            rows = [line.split() for line in self.stall_out.read_text().splitlines()]
        except FileNotFoundError:
            return None
        rows = [row for row in rows if t_from <= int(row[0]) <= t_to]
        if not rows:
            return {"max_stall_ms": 0.0, "stall_loop_cpu_ms": None, "stall_process_cpu_ms": None}
        # the probe logs only new maxima: the largest in the window is the window's worst tick
        row = max(rows, key=lambda r: float(r[1]))
        return {"max_stall_ms": float(row[1]),
                "stall_loop_cpu_ms": float(row[2]) if len(row) > 2 else None,
                "stall_process_cpu_ms": float(row[3]) if len(row) > 3 else None}

    def first_received(self) -> dict[tuple[str, int], int]:
        """The probe's receive time of each ``(key, bench/seq)`` watch event (its first, if repeated)."""
        first: dict[tuple[str, int], int] = {}
        for t, key, seq in self.received():
            if seq.isdigit():
                first.setdefault((key, int(seq)), t)
        return first

    def received(self) -> list[tuple[int, str, str]]:
        try:
            rows = [line.split(" ") for line in self.recv_out.read_text().splitlines()]
        except FileNotFoundError:
            return []
        return [(int(t), k, s) for t, k, s in rows]


# ------------------------------------------------------------------------------ load generator


@dataclass
class Write:
    name: str
    seq: int
    send: int
    ack: int
    status: int


class LoadGen:
    """The Go load generator (bench/loadgen), as the ``bench-loadgen`` user (system:masters)."""

    def __init__(self, cp: BenchControlPlane, user_kubeconfig: str, resource: Resource, size: int) -> None:
        self.cp = cp
        stem = Path(user_kubeconfig).with_suffix("")
        self.base = ["-server", cp.host, "-ca", cp.ca_file, "-cert", f"{stem}.crt", "-key", f"{stem}.key",
                     "-resource", f"{resource.api_prefix}|{resource.plural}", "-api-version",
                     resource.api_version, "-kind", resource.kind]
        self.size = size
        self.binary = str(LOADGEN / "loadgen")

    def _run(self, mode: str, ns: str, args: list[str], timeout: float = 900) -> list[Write]:
        out = subprocess.run([self.binary, mode, *self.base, "-namespace", ns, *args], capture_output=True,
                             text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"loadgen {mode} failed: {out.stderr[-2000:]}")
        writes = []
        for line in out.stdout.splitlines():
            n, s, a, b, st = line.split(",")
            writes.append(Write(n, int(s), int(a), int(b), int(st)))
        return writes

    def create(self, ns: str, prefix: str, count: int, concurrency: int = 16) -> list[Write]:
        return self._run("create", ns, ["-prefix", prefix, "-count", str(count), "-size", str(self.size),
                                        "-concurrency", str(concurrency)])

    def churn(self, ns: str, prefix: str, count: int, rate: float, seconds: float, seq_start: int,
              concurrency: int = 32) -> list[Write]:
        return self._run("churn", ns, ["-prefix", prefix, "-count", str(count), "-rate", str(rate),
                                       "-duration", f"{seconds}s", "-seq-start", str(seq_start),
                                       "-concurrency", str(concurrency)])

    def burst(self, ns: str, name: str, count: int, seq_start: int) -> list[Write]:
        return self._run("burst", ns, ["-name", name, "-count", str(count), "-seq-start", str(seq_start),
                                       "-concurrency", "1"])


# ------------------------------------------------------------------------------ audit log


@dataclass
class AuditEntry:
    t: int  # requestReceivedTimestamp, unix ns
    user: str
    user_agent: str
    verb: str
    resource: str


class AuditLog:
    """Reads the apiserver's audit log incrementally; one entry per auditID."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._pos = 0
        self._seen: set[str] = set()
        self.entries: list[AuditEntry] = []

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._pos)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1
        self._pos += end
        for raw in data[:end].splitlines():
            ev = json.loads(raw)
            aid = ev.get("auditID")
            if aid in self._seen:
                continue
            self._seen.add(aid)
            ref = ev.get("objectRef") or {}
            res = ref.get("resource", "") + ("/" + ref["subresource"] if ref.get("subresource") else "")
            self.entries.append(AuditEntry(_rfc3339_ns(ev["requestReceivedTimestamp"]),
                                           ev.get("user", {}).get("username", ""), ev.get("userAgent", ""),
                                           ev.get("verb", ""), res))

    def count(self, user: str, t_from: int, t_to: int) -> dict[str, int]:
        """Requests of ``user`` received in [t_from, t_to], by verb (get, list, watch, patch, …)."""
        self.poll()
        out: dict[str, int] = {}
        for e in self.entries:
            if e.user == user and t_from <= e.t <= t_to:
                out[e.verb] = out.get(e.verb, 0) + 1
        return out

    def user_agents(self, user: str) -> set[str]:
        return {e.user_agent for e in self.entries if e.user == user}


def _rfc3339_ns(s: str) -> int:
    # 2026-11-30T20:39:16.123456Z
    from datetime import datetime, timezone

    main, _, frac = s.rstrip("Z").partition(".")
    dt = datetime.strptime(main, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    return int(dt.timestamp()) * 1_000_000_000 + int((frac or "0").ljust(9, "0")[:9])


# ------------------------------------------------------------------------------ latency pairing


def pair_latencies(events: Iterable[tuple[str, int, int]], reconciles: Iterable[tuple[int, str, str]]
                   ) -> tuple[list[tuple[str, int, int, int | None, bool]], int]:
    """Event→reconcile latency for every event ``(key, seq, t_event_ns)``.

    The reconcile that handles an event is the first reconcile of the same key that read a
    ``bench/seq`` at least as new (dedup may fold many events into one reconcile). Returns rows
    ``(key, seq, t_event, latency_ns or None, seen_exactly)`` and the number of reconciles that
    matched any event.
    """
    by_key: dict[str, list[tuple[int, int]]] = {}
    for t, key, seq in reconciles:
        if seq.isdigit():
            by_key.setdefault(key, []).append((int(seq), t))
    index: dict[str, tuple[list[int], list[int]]] = {}
    for key, recs in by_key.items():
        # walk this key's reconciles in time order, keeping only those that read a newer seq than
        # every earlier one: the answer for "first reconcile with seq >= s" is among them, and their
        # seqs are increasing, so a bisect finds it
        recs.sort(key=lambda r: r[1])
        seqs, times = [], []
        best = -1
        for s, t in recs:
            if s > best:
                best = s
                seqs.append(s)
                times.append(t)
        index[key] = (seqs, times)
    rows = []
    exact: dict[str, set[int]] = {}
    for t, key, seq in reconciles:
        if seq.isdigit():
            exact.setdefault(key, set()).add(int(seq))
    for key, seq, t_ev in events:
        entry = index.get(key)
        lat = None
        if entry:
            seqs, times = entry
            i = bisect.bisect_left(seqs, seq)
            if i < len(seqs):
                lat = times[i] - t_ev
        rows.append((key, seq, t_ev, lat, seq in exact.get(key, ())))
    return rows, sum(len(v) for v in by_key.values())


def percentiles(values: list[float], ps: Iterable[float] = (50, 90, 99, 99.9)) -> dict[str, float]:
    if not values:
        return {f"p{p:g}": float("nan") for p in ps} | {"max": float("nan")}
    s = sorted(values)
    out = {}
    for p in ps:
        k = min(len(s) - 1, max(0, int(round(p / 100 * len(s) + 0.5)) - 1))
        out[f"p{p:g}"] = s[k]
    out["max"] = s[-1]
    return out


def write_gz_csv(path: Path, header: list[str], rows: Iterable[Iterable[Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", newline="") as f:
        f.write(",".join(header) + "\n")
        for r in rows:
            f.write(",".join("" if v is None else str(v) for v in r) + "\n")


def wait_until(cond: Callable[[], bool], timeout: float, tick: float = 0.05,
               on_tick: Callable[[], None] | None = None, every: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout
    last = time.monotonic()
    while True:
        if cond():
            return True
        if time.monotonic() > deadline:
            return False
        if on_tick and time.monotonic() - last >= every:
            on_tick()
            last = time.monotonic()
        time.sleep(tick)


def which(name: str) -> str | None:
    return shutil.which(name)
