"""The declop benchmark: one command runs every scenario for every operator on a local control plane.

    python bench/run.py --quick          # make bench-quick: N=1k, 1 run, short windows, small extras
    python bench/run.py                  # make bench: N=1k and 10k, 3 runs, 100k, every extra scenario
    python bench/run.py --resource crd   # the CRD variant (Widgets of ~6 KB) instead of ConfigMaps

Scenarios a–g run here, operator by operator on one control plane; the 100k row (``--big``) cold-starts
each operator in turn on one shared set of objects. Then the extra scenarios run, each its own script on
its own control plane, writing into the same folder (``--extras``): scale-out (scaleout.py), priority
(priority.py), admission h (admission.py) and metadata-only memory (metadata_rss.py). report.py turns
the whole folder into one table.

Writes bench/results/<date>[-quick|-crd]/: one CSV per scenario, raw latency CSVs, the extras' folders,
summary.md, PNGs. See bench/README.md for the method.
"""

from __future__ import annotations

import argparse
import csv
import http.client
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lib import (  # noqa: E402
    BENCH, CONFIGMAPS, GO_BASELINE, LOADGEN, OPERATOR_GROUP, OPERATORS, REPO, WIDGETS, AuditLog,
    BenchControlPlane, LoadGen, OperatorProcess, OperatorSpec, Resource, go_build, install_crd, kopf_venv,
    kopf_version, pair_latencies, percentiles, progress, wait_until, write_gz_csv,
)

DEFAULT_OPERATORS = ["declop", "declop-paged", "kopf-event", "kopf-cu", "kopf-cu-nopost", "controller-runtime",
                     "controller-runtime-json"]
AUX_OPERATORS = ["declop-inproc", "declop-inproc-paged"]
#: who cold-starts on the --big objects (Kopf's one-object-at-a-time start would take the whole run)
BIG_OPERATORS = ["declop", "declop-paged", "controller-runtime", "declop-inproc"]
EXTRAS = ["scaleout", "priority", "admission", "metadata"]
#: the probe that also churns over a real watch: it splits b's latency where the event was received
SPLIT_PROBE = "declop-inproc"


@dataclass
class Settings:
    quick: bool
    runs: int
    a1_sizes: list[int]
    cold_sizes: list[int]
    churn_objects: int
    rates: list[float]
    churn_seconds: float
    idle_seconds: float
    stall_sizes: list[int]
    size_bytes: int
    block_ms: int
    burst: int
    operators: list[str]
    resource: str
    drain_seconds: float
    settle_seconds: float
    big: int = 0
    extras: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class CsvSink:
    """Appends rows to results/<dir>/<scenario>.csv (header on first write)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self._headers: dict[str, list[str]] = {}

    def add(self, scenario: str, row: dict[str, Any]) -> None:
        path = self.out / f"{scenario}.csv"
        if scenario not in self._headers:
            self._headers[scenario] = list(row)
            with open(path, "w", newline="") as f:
                csv.writer(f).writerow(self._headers[scenario])
        with open(path, "a", newline="") as f:
            csv.writer(f).writerow([_fmt(row.get(h)) for h in self._headers[scenario]])


def _fmt(v: Any) -> Any:
    if isinstance(v, float):
        return f"{v:.6g}"
    return "" if v is None else v


@dataclass
class Bench:
    settings: Settings
    cp: BenchControlPlane
    resource: Resource
    loadgen: LoadGen
    audit: AuditLog
    kubeconfigs: dict[str, str]
    sink: CsvSink
    out: Path
    work: Path
    failures: list[str] = field(default_factory=list)
    _shared: set[str] = field(default_factory=set)

    # -- namespaces and objects -----------------------------------------------------------------
    def namespace(self, name: str) -> str:
        self.cp.json("POST", "/api/v1/namespaces", {"metadata": {"name": name}}, ok=(201, 409))
        return name

    def cleanup(self, ns: str) -> None:
        """Delete every benchmark object (and Kopf's Events) in ``ns``; leave the empty namespace."""
        for path in (self.resource.collection(ns), f"/api/v1/namespaces/{ns}/events"):
            for attempt in range(1, 11):
                try:
                    status, data = self.cp.request("DELETE", path, timeout=300)
                    break
                except (http.client.HTTPException, OSError) as exc:
                    # a DELETE of 100k objects can outlive the apiserver's 60 s request timeout,
                    # which closes the connection without a response: delete what is left
                    progress(f"  cleanup {path}: {type(exc).__name__}: {exc}; again ({attempt}/10)")
            else:
                raise RuntimeError(f"cleanup {path}: the apiserver never completed the DELETE")
            if status >= 300:
                progress(f"  cleanup {path}: {status} {data[:200]!r}")

    def create(self, ns: str, prefix: str, count: int) -> list:
        writes = self.loadgen.create(ns, prefix, count)
        bad = [w for w in writes if w.status != 201]
        if bad:
            raise RuntimeError(f"{len(bad)} creates failed, e.g. {bad[0]}")
        return writes

    # -- operator lifecycle helpers -------------------------------------------------------------
    def start(self, spec: OperatorSpec, ns: str, tag: str) -> OperatorProcess:
        return OperatorProcess(spec, ns, self.kubeconfigs[spec.name], self.work / ns / spec.name, self.resource)

    def shared(self, n: int) -> str:
        """The namespace of the ``--big`` lifecycles: ``n`` objects created once, read by every operator.

        The benchmark's operators never write to their objects, so one operator's cold start leaves
        the objects as the next one finds them."""
        ns = f"shared-{n}"
        if ns not in self._shared:
            self.namespace(ns)
            progress(f"  creating {n:,} objects once for every operator's cold start")
            self.create(ns, "obj-", n)
            self._shared.add(ns)
        return ns

    def wait_keys(self, op: OperatorProcess, ns: str, prefix: str, count: int, what: str,
                  since: int = 0) -> dict[str, int] | None:
        """Wait until each of ``count`` keys ``ns/prefix<i>`` was reconciled once; first times by key."""
        first: dict[str, int] = {}
        want = f"{ns}/{prefix}"
        idx = 0

        def done() -> bool:
            nonlocal idx
            op.log.poll()
            lines = op.log.lines
            while idx < len(lines):
                t, key, _ = lines[idx]
                idx += 1
                if t >= since and key.startswith(want) and key not in first:
                    first[key] = t
            if not op.alive():
                raise RuntimeError(f"{op.spec.name} exited with {op.popen.returncode}:\n{op.tail()}")
            return len(first) >= count

        timeout = 60 + count * (0.06 if op.spec.kind == "kopf" else 0.02)
        ok = wait_until(done, timeout, on_tick=lambda: progress(f"    {what}: {len(first)}/{count} reconciled"))
        if not ok:
            self.fail(f"{op.spec.name} {what}: only {len(first)}/{count} reconciled after {timeout:.0f} s")
            return None
        return first

    def settle(self, op: OperatorProcess, quiet: float = 2.0, limit: float = 60.0) -> None:
        """Wait until the operator logged no reconcile for ``quiet`` seconds (at most ``limit``)."""
        deadline = time.monotonic() + limit
        last_n, last_change = -1, time.monotonic()
        while time.monotonic() < deadline:
            op.log.poll()
            if len(op.log.lines) != last_n:
                last_n, last_change = len(op.log.lines), time.monotonic()
            elif time.monotonic() - last_change >= quiet:
                return
            time.sleep(0.1)

    def fail(self, msg: str) -> None:
        progress(f"  ! {msg}")
        self.failures.append(msg)

    def requests(self, op: OperatorProcess, t0: int, t1: int) -> dict[str, int]:
        time.sleep(0.3)  # let the audit backend write the last events
        return self.audit.count(f"bench-{op.spec.name}", t0, t1)

    # -- lifecycle A: warm operator, empty namespace: f(0), RSS(0), a1(M) --------------------------
    def lifecycle_a1(self, spec: OperatorSpec, run: int, m: int) -> None:
        ns = self.namespace(f"{spec.name}-a1-{m}-r{run}")
        self.create(ns, "probe-", 1)
        op = self.start(spec, ns, "a1")
        try:
            progress(f"  {spec.name}: start with 0 objects (+1 probe)")
            first = self.wait_keys(op, ns, "probe-", 1, "f(0)")
            if first:
                self.sink.add("f", {"operator": spec.name, "run": run, "n": 0,
                                    "start_to_first_reconcile_s": (min(first.values()) - op.t_exec) / 1e9})
            self.settle(op, quiet=self.settings.settle_seconds)
            rss, hwm = op.rss_kib()
            self.sink.add("c", {"operator": spec.name, "run": run, "n": 0, "rss_kib": rss, "hwm_kib": hwm,
                                "note": "a1 lifecycle, before creates"})
            progress(f"  {spec.name}: a1 create {m} objects while running")
            t_before = time.time_ns()
            cpu0 = op.cpu_seconds()
            writes = self.create(ns, "a1-", m)
            last_ack = max(w.ack for w in writes)
            first_send = min(w.send for w in writes)
            got = self.wait_keys(op, ns, "a1-", m, f"a1({m})", since=t_before)
            if got:
                last = max(got.values())
                self.sink.add("a1", {
                    "operator": spec.name, "run": run, "n": m,
                    "drain_lag_s": max(0, last - last_ack) / 1e9,
                    "total_s": (last - first_send) / 1e9,
                    "create_s": (last_ack - first_send) / 1e9,
                    "cpu_s": op.cpu_seconds() - cpu0,
                })
        finally:
            op.stop()
            self.cleanup(ns)

    # -- lifecycle C: N existing objects: f(N), a2(N), g, RSS(N); at the churn size also d, b, e ---
    def lifecycle_cold(self, spec: OperatorSpec, run: int, n: int, shared: str | None = None) -> None:
        """``shared``: a namespace whose ``n`` objects exist already and stay (the --big row)."""
        churn = n == self.settings.churn_objects and shared is None
        if spec.aux and not churn and n not in self.settings.stall_sizes:
            return
        ns = shared or self.namespace(f"{spec.name}-cold-{n}-r{run}")
        if not shared:
            progress(f"  {spec.name}: preparing {n} objects")
            self.create(ns, "obj-", n)
        op = self.start(spec, ns, "cold")
        try:
            progress(f"  {spec.name}: cold start with {n} objects")
            first = self.wait_keys(op, ns, "obj-", n, f"a2({n})")
            if first:
                t_first, t_all = min(first.values()), max(first.values())
                self.sink.add("a2", {"operator": spec.name, "run": run, "n": n,
                                     "start_to_all_reconciled_s": (t_all - op.t_exec) / 1e9})
                if not spec.aux:
                    self.sink.add("f", {"operator": spec.name, "run": run, "n": n,
                                        "start_to_first_reconcile_s": (t_first - op.t_exec) / 1e9})
                stall = op.worst_stall(op.t_exec, t_all)
                if stall is not None:
                    self.sink.add("g", {"operator": spec.name, "run": run, "n": n, **stall,
                                        "window": "process start to all reconciled (a2)"})
            self.settle(op, quiet=self.settings.settle_seconds)
            rss, hwm = op.rss_kib()
            if not spec.aux:
                self.sink.add("c", {"operator": spec.name, "run": run, "n": n, "rss_kib": rss, "hwm_kib": hwm,
                                    "note": f"cold lifecycle, after sync, {self.settings.settle_seconds:g} s quiet"})
            if churn and first:
                self.idle_window(spec, op, run)
                self.churn(spec, op, run, ns, n)
                if not spec.aux:
                    self.dedup(spec, op, run, ns)
        finally:
            op.stop()
            if not shared:
                self.cleanup(ns)
        if op.churned:
            self.split(spec, op, run, ns)

    def split(self, spec: OperatorSpec, op: OperatorProcess, run: int, ns: str) -> None:
        """b's end-to-end latency in two, from the probe's receive times (its list is written at exit):
        ``delivery`` = update sent → its watch event received by declop (the apiserver, the network,
        the socket), ``pipeline`` = event received → the reconcile that read it (declop alone)."""
        first = op.first_received()
        recs = op.log.lines
        for rate, ok, achieved in op.churned:
            delivery = [(f"{ns}/{w.name}", w.seq, w.send, first.get((f"{ns}/{w.name}", w.seq)))
                        for w in ok]
            rows = [(k, seq, sent, None if t is None else t - sent, t is not None) for k, seq, sent, t in delivery]
            self._latency_rows(spec, run, rate, "delivery", rows, len(recs), achieved, 0, float("nan"), 0)
            events = [(k, seq, t) for k, seq, _, t in delivery if t is not None]
            rows, _ = pair_latencies(events, recs)
            self._latency_rows(spec, run, rate, "pipeline", rows, len(recs), achieved, 0, float("nan"), 0)

    def idle_window(self, spec: OperatorSpec, op: OperatorProcess, run: int) -> None:
        if spec.aux:
            return
        secs = self.settings.idle_seconds
        progress(f"  {spec.name}: idle {secs:g} s")
        t0, cpu0 = time.time_ns(), op.cpu_seconds()
        time.sleep(secs)
        t1, cpu1 = time.time_ns(), op.cpu_seconds()
        op.log.poll()
        recs = len(op.log.since(t0))
        by_verb = self.requests(op, t0, t1)
        self.sink.add("d", {"operator": spec.name, "run": run, "window": "idle", "seconds": (t1 - t0) / 1e9,
                            "reconciles": recs, "cpu_cores": (cpu1 - cpu0) / ((t1 - t0) / 1e9),
                            **_verbs(by_verb)})

    def churn(self, spec: OperatorSpec, op: OperatorProcess, run: int, ns: str, k: int) -> None:
        for i, rate in enumerate(self.settings.rates):
            seq0 = (i + 1) * 10_000_000
            secs = self.settings.churn_seconds
            progress(f"  {spec.name}: churn {rate:g} updates/s over {k} objects for {secs:g} s")
            t0, cpu0 = time.time_ns(), op.cpu_seconds()
            writes = self.loadgen.churn(ns, "obj-", k, rate, secs, seq0)
            t_gen = time.time_ns()
            ok = [w for w in writes if w.status == 200]
            last_seq: dict[str, int] = {}
            for w in ok:
                last_seq[f"{ns}/{w.name}"] = max(w.seq, last_seq.get(f"{ns}/{w.name}", 0))

            def drained() -> bool:
                op.log.poll()
                seen: dict[str, int] = {}
                for _, key, s in op.log.since(t0):
                    if s.isdigit():
                        seen[key] = max(seen.get(key, 0), int(s))
                return all(seen.get(key, 0) >= s for key, s in last_seq.items())

            wait_until(drained, self.settings.drain_seconds, tick=0.2)
            t1, cpu1 = time.time_ns(), op.cpu_seconds()
            recs = op.log.since(t0)
            rows, matched = pair_latencies([(f"{ns}/{w.name}", w.seq, w.send) for w in ok], recs)
            achieved = len(ok) / ((max(w.send for w in ok) - min(w.send for w in ok)) / 1e9) if len(ok) > 1 else 0
            self._latency_rows(spec, run, rate, "e2e", rows, len(recs), achieved, len(writes) - len(ok),
                               (cpu1 - cpu0) / ((t1 - t0) / 1e9), (t_gen - t0) / 1e9)
            if spec.kind == "declop-inproc":
                op.churned.append((rate, ok, achieved))
            if not spec.aux:
                by_verb = self.requests(op, t0, t1)
                self.sink.add("d", {"operator": spec.name, "run": run, "window": f"churn {rate:g}/s",
                                    "seconds": (t1 - t0) / 1e9, "reconciles": len(recs),
                                    "cpu_cores": (cpu1 - cpu0) / ((t1 - t0) / 1e9), **_verbs(by_verb)})
            self.settle(op, quiet=1.0, limit=30)

    def _latency_rows(self, spec: OperatorSpec, run: int, rate: float, kind: str, rows: list, reconciles: int,
                      achieved: float, failed: int, cores: float, gen_seconds: float, cached: int = 0) -> None:
        lat = [r[3] / 1e6 for r in rows if r[3] is not None]
        pct = percentiles(lat)
        missed = sum(1 for r in rows if r[3] is None)
        exact = sum(1 for r in rows if r[4])
        self.sink.add("b", {
            "operator": spec.name, "run": run, "rate": rate, "latency": kind,
            "cached": cached or self.settings.churn_objects, "achieved_rate": achieved,
            "updates": len(rows), "failed_writes": failed, "reconciles": reconciles,
            "p50_ms": pct["p50"], "p90_ms": pct["p90"], "p99_ms": pct["p99"], "p99.9_ms": pct["p99.9"],
            "max_ms": pct["max"], "not_reconciled": missed, "seen_exactly_share": exact / len(rows) if rows else 0,
            "cpu_cores": cores, "generator_seconds": gen_seconds,
        })
        suffix = f"_n{cached}" if cached else ""
        write_gz_csv(self.out / "raw" / f"b_{spec.name}_{kind}_{rate:g}{suffix}_r{run}.csv.gz",
                     ["seq", "latency_us", "seen_exactly"],
                     ((r[1], None if r[3] is None else r[3] // 1000, int(r[4])) for r in rows))

    # -- lifecycle S: declop's in-process probes (g stall during a2; b in-process, synthetic watch) --
    def lifecycle_synthetic(self, spec: OperatorSpec, run: int, n: int, shared: str | None = None) -> None:
        ns = shared or self.namespace(f"{spec.name}-{n}-r{run}")
        if not shared:
            progress(f"  {spec.name}: preparing {n} objects")
            self.create(ns, "obj-", n)
        phases = [(rate, self.settings.churn_seconds) for rate in self.settings.rates]
        env = {"BENCH_SYNTH": ",".join(f"{r:g}:{t:g}" for r, t in phases), "BENCH_PLURAL": self.resource.plural}
        op = OperatorProcess(spec, ns, self.kubeconfigs[spec.name], self.work / ns / spec.name, self.resource, env)
        try:
            progress(f"  {spec.name}: cold start with {n} objects (stall probe), then a synthetic watch at "
                     f"{', '.join(f'{r:g}/s' for r, _ in phases)}")
            first = self.wait_keys(op, ns, "obj-", n, f"a2({n})")
            if not first:
                return
            t_all = max(first.values())
            self.sink.add("a2", {"operator": spec.name, "run": run, "n": n,
                                 "start_to_all_reconciled_s": (t_all - op.t_exec) / 1e9})
            self.sink.add("g", {"operator": spec.name, "run": run, "n": n,
                                **(op.worst_stall(op.t_exec, t_all)
                                   or {"max_stall_ms": None, "stall_loop_cpu_ms": None, "stall_process_cpu_ms": None}),
                                "window": "process start to all reconciled (a2)"})
            last = len(phases) * 10_000_000 + int(phases[-1][0] * phases[-1][1]) - 1

            def finished() -> bool:
                op.log.poll()
                return any(s.isdigit() and int(s) >= last for _, _, s in op.log.lines[-50:])

            wait_until(finished, 30 + sum(t + 1 for _, t in phases), tick=0.2)
            self.settle(op, quiet=1.0, limit=20)
        finally:
            op.stop()
            if not shared:
                self.cleanup(ns)
        received = op.received()
        for p, (rate, _t) in enumerate(phases, start=1):
            lo, hi = p * 10_000_000, (p + 1) * 10_000_000
            events = [(k, int(s), t) for t, k, s in received if s.isdigit() and lo <= int(s) < hi]
            recs = [x for x in op.log.lines if x[2].isdigit() and lo <= int(x[2]) < hi]
            rows, _ = pair_latencies(events, recs)
            achieved = 0.0
            if len(events) > 1:
                achieved = len(events) / ((max(e[2] for e in events) - min(e[2] for e in events)) / 1e9)
            self._latency_rows(spec, run, rate, "in-process", rows, len(recs), achieved, 0, float("nan"), 0,
                               cached=n)

    def dedup(self, spec: OperatorSpec, op: OperatorProcess, run: int, ns: str) -> None:
        s = self.settings
        # busy: a reconcile of obj-0 blocks block_ms; send `burst` updates meanwhile
        seq = 90_000_000
        key = f"{ns}/obj-0"
        progress(f"  {spec.name}: e busy ({s.burst} updates during a {s.block_ms} ms reconcile)")
        t0 = time.time_ns()
        self.cp.json("PATCH", f"{self.resource.collection(ns)}/obj-0",
                     {"metadata": {"annotations": {"bench/seq": str(seq), "bench/block": str(seq),
                                                   "bench/block-ms": str(s.block_ms)}}},
                     content_type="application/merge-patch+json")

        def blocked_started() -> bool:
            op.log.poll()
            return any(k == key and v == str(seq) for _, k, v in op.log.since(t0))

        if not wait_until(blocked_started, 20):
            self.fail(f"{spec.name} e: the blocking reconcile never started")
            return
        t_block = next(t for t, k, v in op.log.since(t0) if k == key and v == str(seq))
        writes = self.loadgen.burst(ns, "obj-0", s.burst, seq + 1)
        burst_s = (max(w.ack for w in writes) - min(w.send for w in writes)) / 1e9
        time.sleep(max(0.0, (t_block / 1e9 + s.block_ms / 1000) - time.time()))
        self.settle(op, quiet=self.settings.settle_seconds, limit=120)
        n = sum(1 for _, k, _ in op.log.since(t_block) if k == key)
        self.sink.add("e", {"operator": spec.name, "run": run, "case": "busy", "updates": s.burst,
                            "reconciles": n, "burst_seconds": burst_s,
                            "note": f"counted from the blocking reconcile (included) until "
                                    f"{s.settle_seconds:g} s quiet; "
                                    f"burst within the block: {burst_s < s.block_ms / 1000}"})
        # idle burst on obj-1
        progress(f"  {spec.name}: e idle burst ({s.burst} updates)")
        key = f"{ns}/obj-1"
        t0 = time.time_ns()
        writes = self.loadgen.burst(ns, "obj-1", s.burst, seq + 1000)
        burst_s = (max(w.ack for w in writes) - min(w.send for w in writes)) / 1e9
        self.settle(op, quiet=self.settings.settle_seconds, limit=120)
        n = sum(1 for _, k, _ in op.log.since(t0) if k == key)
        self.sink.add("e", {"operator": spec.name, "run": run, "case": "idle burst", "updates": s.burst,
                            "reconciles": n, "burst_seconds": burst_s,
                            "note": f"until {s.settle_seconds:g} s quiet"})


def _verbs(by_verb: dict[str, int]) -> dict[str, int]:
    verbs = ["get", "list", "watch", "create", "update", "patch", "delete"]
    out = {f"req_{v}": by_verb.get(v, 0) for v in verbs}
    out["req_other"] = sum(c for v, c in by_verb.items() if v not in verbs)
    return out


# -------------------------------------------------------------------------------------- main


def declop_tree_hash() -> str:
    """A hash of declop/'s sources: the summary warns when declop changed while the bench ran."""
    import hashlib

    h = hashlib.sha256()
    for p in sorted((REPO / "declop").rglob("*.py")):
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def machine_facts(cp: BenchControlPlane, settings: Settings) -> dict[str, Any]:
    def cmd(*argv: str) -> str:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip()
        except OSError:
            return "?"

    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = "?"
    with open("/proc/meminfo") as f:
        mem = f"{int(f.readline().split()[1]) / 1024 / 1024:.1f} GiB"
    version = cp.json("GET", "/version")
    import aiohttp
    import declop

    try:
        import orjson

        orjson_v = orjson.__version__
    except ImportError:
        orjson_v = "not installed"
    gomod = (GO_BASELINE / "go.mod").read_text()

    def gover(mod: str) -> str:
        for line in gomod.splitlines():
            if line.strip().startswith(mod + " "):
                return line.split()[1]
        return "?"

    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "cpu": cpu, "vcpus": os.cpu_count(), "memory": mem, "kernel": platform.release(),
        "python": platform.python_version(), "declop": declop.__version__,
        "declop_commit": cmd("git", "-C", str(REPO), "rev-parse", "--short", "HEAD"),
        "declop_dirty": bool(cmd("git", "-C", str(REPO), "status", "--porcelain", "--", "declop")),
        "declop_tree": declop_tree_hash(),
        "orjson": orjson_v, "aiohttp": aiohttp.__version__, "kopf": kopf_version(),
        "controller_runtime": gover("sigs.k8s.io/controller-runtime"), "client_go": gover("k8s.io/client-go"),
        "go": cmd("go", "env", "GOVERSION"), "kubernetes": version.get("gitVersion"),
        "etcd": cmd(cp.binary("etcd"), "--version").splitlines()[0] if cp.binary("etcd") else "?",
        "settings": settings.as_dict(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="N=1k only, 1 run, short windows (<= 5 min)")
    ap.add_argument("--runs", type=int, help="runs per scenario (default 3; quick 1)")
    ap.add_argument("--n", type=int, action="append", help="cold-start sizes besides 0 (default 1000 10000)")
    ap.add_argument("--a1", type=int, action="append", help="a1 sizes (default 1000 10000)")
    ap.add_argument("--churn-objects", type=int, default=1000)
    ap.add_argument("--rate", type=float, action="append", help="churn rates (default 100 1000)")
    ap.add_argument("--churn-seconds", type=float)
    ap.add_argument("--idle-seconds", type=float)
    ap.add_argument("--big", type=int, help="the large row: a2, f, c and g (declop probe) over this many objects, "
                    "created once and cold-started on by each of " + ", ".join(BIG_OPERATORS) +
                    " (default 100000; quick 0: none)")
    ap.add_argument("--stall-100k", action="store_true", help="the same as --big 100000")
    ap.add_argument("--extras", help=f"comma list of extra scenarios after a–g (default {','.join(EXTRAS)}; "
                    "'' for none)")
    ap.add_argument("--size", type=int, default=6000, help="payload bytes per object (~6 KB)")
    ap.add_argument("--operators", help=f"comma list (default {','.join(DEFAULT_OPERATORS)})")
    ap.add_argument("--resource", choices=["configmaps", "crd"], default="configmaps")
    ap.add_argument("--out", help="results folder (default bench/results/<date>[-quick][-crd])")
    args = ap.parse_args(argv)

    quick = args.quick

    def _terminate(signum: int, frame: Any) -> None:  # SIGTERM: stop like Ctrl-C, keep what was measured
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    cold = args.n or ([1000] if quick else [1000, 10000])
    stall = sorted(set(cold))
    big = 100000 if args.stall_100k else args.big if args.big is not None else 0 if quick else 100000
    extras = EXTRAS if args.extras is None else [x for x in args.extras.split(",") if x]
    if set(extras) - set(EXTRAS):
        ap.error(f"unknown extra scenario(s) {', '.join(sorted(set(extras) - set(EXTRAS)))}; "
                 f"choose from {', '.join(EXTRAS)}")
    settings = Settings(
        quick=quick, runs=args.runs or (1 if quick else 3),
        a1_sizes=args.a1 or ([1000] if quick else [1000, 10000]),
        cold_sizes=sorted(set(cold)), churn_objects=args.churn_objects,
        rates=args.rate or [100.0, 1000.0], churn_seconds=args.churn_seconds or (5.0 if quick else 15.0),
        idle_seconds=args.idle_seconds or (5.0 if quick else 30.0), stall_sizes=stall,
        size_bytes=args.size, block_ms=2000, burst=100,
        operators=(args.operators.split(",") if args.operators else DEFAULT_OPERATORS) + AUX_OPERATORS,
        resource=args.resource,
        drain_seconds=6.0 if quick else 45.0, settle_seconds=1.5 if quick else 3.0,
        big=big, extras=extras,
    )
    if settings.churn_objects not in settings.cold_sizes:
        settings.cold_sizes = sorted({*settings.cold_sizes, settings.churn_objects})
    suffix = ("-quick" if quick else "") + ("-crd" if args.resource == "crd" else "")
    out = Path(args.out) if args.out else BENCH / "results" / f"{date.today().isoformat()}{suffix}"
    if out.exists():
        for p in sorted(out.rglob("*"), reverse=True):
            p.unlink() if p.is_file() else p.rmdir()
    out.mkdir(parents=True, exist_ok=True)
    work = BENCH / ".work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    began = time.monotonic()
    progress(f"declop bench ({'quick' if quick else 'full'}): results in {_rel(out)}")
    if any(OPERATORS[o].kind == "go" for o in settings.operators):
        go_build(GO_BASELINE, "baseline")
    go_build(LOADGEN, "loadgen")
    if any(OPERATORS[o].kind == "kopf" for o in settings.operators):
        kopf_venv()
    resource = WIDGETS if args.resource == "crd" else CONFIGMAPS
    progress("starting the control plane (etcd + kube-apiserver with an audit log)")
    with BenchControlPlane(controller_manager=False) as cp:
        if resource is WIDGETS:
            install_crd(cp)
        kubeconfigs = {name: cp.add_user(f"bench-{name}", groups=["system:masters", OPERATOR_GROUP])
                       for name in settings.operators}
        gen = cp.add_user("bench-loadgen", groups=["system:masters"])
        facts = machine_facts(cp, settings)
        (out / "meta.json").write_text(json.dumps(facts, indent=2) + "\n")
        bench = Bench(settings, cp, resource, LoadGen(cp, gen, resource, settings.size_bytes),
                      AuditLog(cp.audit_log_path), kubeconfigs, CsvSink(out), out, work)
        specs = [OPERATORS[o] for o in settings.operators]
        run = 0
        try:
            for run in range(1, settings.runs + 1):
                for m in settings.a1_sizes:
                    for spec in specs:
                        if spec.aux:
                            continue
                        progress(f"run {run}/{settings.runs} · a1 + f(0) · N={m} · {spec.name}")
                        _guard(bench, spec, lambda: bench.lifecycle_a1(spec, run, m))
                for n in settings.cold_sizes:
                    for spec in specs:
                        if spec.aux and (n != settings.churn_objects or spec.name != SPLIT_PROBE):
                            continue
                        progress(f"run {run}/{settings.runs} · a2 + f + c + g (+ b, d, e at {settings.churn_objects}) · "
                                 f"N={n} · {spec.name}")
                        _guard(bench, spec, lambda: bench.lifecycle_cold(spec, run, n))
                for n in settings.stall_sizes:
                    for spec in specs:
                        if spec.aux:
                            progress(f"run {run}/{settings.runs} · g + b in-process · N={n} · {spec.name}")
                            _guard(bench, spec, lambda: bench.lifecycle_synthetic(spec, run, n))
                for spec in specs if settings.big else []:
                    if spec.name not in BIG_OPERATORS:
                        continue
                    n = settings.big
                    progress(f"run {run}/{settings.runs} · a2 + f + c + g · N={n:,} (shared objects) · {spec.name}")
                    lifecycle = bench.lifecycle_synthetic if spec.aux else bench.lifecycle_cold
                    _guard(bench, spec, lambda: lifecycle(spec, run, n, bench.shared(n)))
        except KeyboardInterrupt:  # keep what was measured: summary of the completed lifecycles
            progress(f"interrupted during run {run}; writing the summary of what was measured")
            facts["interrupted"] = f"during run {run} of {settings.runs}"
        bench.audit.poll()
        for name in settings.operators:
            agents = bench.audit.user_agents(f"bench-{name}")
            facts.setdefault("user_agents", {})[name] = sorted(agents)
        facts["failures"] = bench.failures
        if declop_tree_hash() != facts["declop_tree"]:
            facts["declop_changed_during_run"] = True
            progress("warning: declop/ changed while the benchmark ran; see meta.json")
        facts["wall_seconds"] = round(time.monotonic() - began, 1)
        (out / "meta.json").write_text(json.dumps(facts, indent=2) + "\n")
    if "interrupted" not in facts:
        run_extras(out, settings)
    import report

    report.write(out)
    progress(f"done in {time.monotonic() - began:.0f} s: {_rel(out)}/summary.md")
    if bench.failures:
        progress(f"{len(bench.failures)} measurement(s) failed; see meta.json")
    return 0


def extra_commands(out: Path, settings: Settings) -> dict[str, list[list[str]]]:
    """Each extra scenario's command lines (its script writes into ``out``; report.py reads it there)."""
    q = settings.quick
    return {
        "scaleout": [["scaleout.py", "--n", "1000" if q else "10000", "--seconds", "10" if q else "20",
                      "--idle-seconds", "5" if q else "10", "--out", str(out / "scaleout")]],
        "priority": [["priority.py", "restart", "--n", "2000", "--handler-ms", "1", "--runs", "1" if q else "2",
                      "--out", str(out / "priority")],
                     ["priority.py", "starvation", "--low", "1000", "--rate", "200", "--seconds", "20",
                      "--handler-ms", "5", "--out", str(out / "priority")]],
        "admission": [["admission.py", "--seconds", "10" if q else "20", "--runs", "1" if q else "2",
                       "--out", str(out)]],
        "metadata": [["metadata_rss.py", "--n", "2000", "--runs", "3", "--json", str(out / "metadata_rss.json")]],
    }


def run_extras(out: Path, settings: Settings) -> None:
    """Run the extra scenarios one after another, each its own process and control plane; a failed one
    is recorded in meta.json (``failures``) and the others still run."""
    commands = extra_commands(out, settings)
    for name in settings.extras:
        for argv in commands[name]:
            progress(f"extra scenario {name}: python bench/{' '.join(argv)}")
            t0 = time.monotonic()
            proc = subprocess.run([sys.executable, str(BENCH / argv[0]), *argv[1:]], cwd=str(REPO))
            meta = json.loads((out / "meta.json").read_text())  # admission.py adds its settings to it
            meta.setdefault("extras", []).append({"scenario": name, "command": f"python bench/{' '.join(argv)}",
                                                  "seconds": round(time.monotonic() - t0, 1),
                                                  "exit": proc.returncode})
            if proc.returncode:
                meta.setdefault("failures", []).append(f"extra {name}: exit {proc.returncode}")
                progress(f"  ! extra scenario {name} failed (exit {proc.returncode})")
            meta["wall_seconds"] = round(meta.get("wall_seconds", 0) + time.monotonic() - t0, 1)
            (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(REPO))
    except ValueError:
        return str(p)


def _guard(bench: Bench, spec: OperatorSpec, fn: Any) -> None:
    try:
        fn()
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # one failed lifecycle must not end the whole run
        bench.fail(f"{spec.name}: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    sys.exit(main())
