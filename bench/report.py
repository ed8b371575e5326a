"""Turns a results folder's CSVs into summary.md and PNG plots. Every figure is computed here from
the CSVs next to it; nothing is typed by hand.

    python bench/report.py bench/results/<date>            # regenerate summary.md and the plots
    python bench/report.py --readme bench/results/<date>   # write bench/README-section.md from it
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

COLUMNS = ["declop", "declop-paged", "kopf-event", "kopf-event-nopost", "kopf-cu", "kopf-cu-nopost", "kopf-validate",
           "controller-runtime", "controller-runtime-json"]
TITLES = {
    "declop": "declop",
    "declop-paged": "declop, paged lists",
    "kopf-event": "Kopf on.event",
    "kopf-event-nopost": "Kopf on.event, no posting",
    "kopf-cu": "Kopf on.create/update",
    "kopf-cu-nopost": "Kopf on.create/update, no posting",
    "kopf-validate": "Kopf on.validate",
    "controller-runtime": "controller-runtime",
    "controller-runtime-json": "controller-runtime, JSON",
}
#: h.csv (bench/admission.py) names its operators by product; its Kopf is the on.validate column
ADMISSION_COLUMNS = {"declop": "declop", "kopf": "kopf-validate"}
#: in-process probe runs, reported in the column of the operator they stand for
PROBES = {"declop-inproc": "declop", "declop-inproc-paged": "declop-paged"}
RATIO_VS = [("kopf-event", "Kopf ev"), ("kopf-cu", "Kopf c/u"), ("kopf-validate", "Kopf val"), ("controller-runtime", "c-r"),
            ("controller-runtime-json", "c-r JSON")]


def read(out: Path, name: str) -> list[dict[str, str]]:
    path = out / f"{name}.csv"
    if not path.exists():
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


def num(v: str | None) -> float | None:
    try:
        x = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


class Metric:
    """One row of the summary: per operator, the values of every run (median, min–max shown)."""

    def __init__(self, title: str, unit: str, target: str = "", check: Callable[[float], bool] | None = None,
                 digits: int = 2, note: str = "") -> None:
        self.title, self.unit, self.target, self.check, self.digits, self.note = title, unit, target, check, digits, note
        self.values: dict[str, list[float]] = {}

    def add(self, op: str, v: float | None) -> None:
        if v is not None:
            self.values.setdefault(op, []).append(v)

    def median(self, op: str) -> float | None:
        vs = self.values.get(op)
        return statistics.median(vs) if vs else None

    def cell(self, op: str) -> str:
        vs = self.values.get(op)
        if not vs:
            return "—"
        med = statistics.median(vs)
        text = _f(med, self.digits)
        if len(vs) > 1:
            text += f" ({_f(min(vs), self.digits)}–{_f(max(vs), self.digits)})"
        return text

    def ratio(self, other: str) -> str:
        a, b = self.median("declop"), self.median(other)
        if a is None or b is None or b == 0:
            return "—"
        r = a / b
        return f"{r:.2g}×" if r < 10 else f"{r:.0f}×"

    def verdict(self) -> str:
        m = self.median("declop")
        if self.check is None or m is None:
            return ""
        return "✓" if self.check(m) else "✗ miss"

    def runs(self) -> str:
        counts = sorted({len(v) for v in self.values.values()})
        return "/".join(str(c) for c in counts) if counts else "0"


def _f(v: float, digits: int) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.{digits}g}" if abs(v) < 1 else f"{v:.{max(digits, 2)}g}" if abs(v) < 10 else f"{v:.0f}"


def metrics(out: Path, meta: dict[str, Any]) -> list[Metric]:
    rows: list[Metric] = []
    s = meta.get("settings", {})
    churn_n = s.get("churn_objects", 1000)

    a1 = read(out, "a1")
    for n in sorted({int(r["n"]) for r in a1}):
        m = Metric(f"a1 drain lag after the last create, N={n:,}", "s",
                   "≤ 1 s at 10k" if n >= 10000 else "", (lambda v: v <= 1.0) if n >= 10000 else None)
        for r in a1:
            if int(r["n"]) == n:
                m.add(r["operator"], num(r["drain_lag_s"]))
        rows.append(m)
    a2 = read(out, "a2")
    for n in sorted({int(r["n"]) for r in a2}):
        target = {10000: ("≤ 2 s", 2.0), 100000: ("≤ 20 s", 20.0)}.get(n)
        m = Metric(f"a2 process start → all reconciled once, N={n:,}", "s", target[0] if target else "",
                   (lambda v, t=target[1]: v <= t) if target else None)
        for r in a2:
            if int(r["n"]) == n and r["operator"] not in PROBES:
                m.add(r["operator"], num(r["start_to_all_reconciled_s"]))
        if not any(c in m.values for c in PROBES.values()):  # only the probe runs have this size
            for r in a2:
                if int(r["n"]) == n and r["operator"] in PROBES:
                    m.add(PROBES[r["operator"]], num(r["start_to_all_reconciled_s"]))
            if m.values:
                m.title += " (declop: the in-process probe runs)"
        rows.append(m)

    b = read(out, "b")
    for rate in sorted({float(r["rate"]) for r in b}):
        for p in ("p50", "p99"):
            target, check = "", None
            if p == "p99":
                target, check = "≤ 100 ms (e2e, unloaded)", (lambda v: v <= 100)
            m = Metric(f"b end-to-end latency {p}, {rate:g} updates/s over {churn_n:,} objects", "ms", target,
                       check)
            for r in b:
                if float(r["rate"]) == rate and r["latency"] == "e2e" and r["operator"] not in PROBES:
                    m.add(r["operator"], num(r[f"{p}_ms"]))
            rows.append(m)
        for kind, what in (("delivery", "update sent → its watch event received (the apiserver's share)"),
                           ("pipeline", "event received → reconcile start (declop's share)")):
            for p in ("p50", "p99"):
                m = Metric(f"b {what} {p}, {rate:g} updates/s, real watch", "ms",
                           note="declop: the in-process probe over the real watch, in its own lifecycle")
                for r in b:
                    if float(r["rate"]) == rate and r["latency"] == kind:
                        m.add(PROBES.get(r["operator"], "declop"), num(r[f"{p}_ms"]))
                if m.values:
                    rows.append(m)
        m = Metric(f"b achieved update rate (target {rate:g}/s)", "updates/s", digits=3)
        for r in b:
            if float(r["rate"]) == rate and r["latency"] == "e2e" and r["operator"] not in PROBES:
                m.add(r["operator"], num(r["achieved_rate"]))
        rows.append(m)
        m = Metric(f"b operator CPU at {rate:g} updates/s", "cores")
        per_k = Metric(f"b operator CPU per 1k updates/s (at {rate:g}/s: cores ÷ achieved rate × 1000)", "cores",
                       "≤ 0.15", lambda v: v <= 0.15)
        for r in b:
            if float(r["rate"]) == rate and r["latency"] == "e2e" and r["operator"] not in PROBES:
                cores, achieved = num(r["cpu_cores"]), num(r["achieved_rate"])
                m.add(r["operator"], cores)
                if cores is not None and achieved:
                    per_k.add(r["operator"], cores / achieved * 1000)
        rows.append(m)
        if rate == max(float(x["rate"]) for x in b):
            rows.append(per_k)

    inproc = [r for r in b if r["latency"] == "in-process"]
    top_cached = max((int(r.get("cached") or 0) for r in inproc), default=0)
    for cached, rate in sorted({(int(r.get("cached") or 0), float(r["rate"])) for r in inproc}):
        for p in ("p50", "p99"):
            t = {"p50": ("≤ 2 ms", 2.0), "p99": ("≤ 20 ms", 20.0)}[p]
            at_target = rate == 1000 and cached == top_cached
            m = Metric(f"b in-process event→reconcile start {p}, {rate:g} ev/s, {cached:,} cached (synthetic watch)",
                       "ms", t[0] + " at 1k ev/s" if at_target else "",
                       (lambda v, lim=t[1]: v <= lim) if at_target else None)
            for r in inproc:
                if float(r["rate"]) == rate and int(r.get("cached") or 0) == cached:
                    m.add(PROBES.get(r["operator"], "declop"), num(r[f"{p}_ms"]))
            rows.append(m)

    c = read(out, "c")
    sizes = sorted({int(r["n"]) for r in c})
    if sizes and sizes[-1] > 0:
        # the slope over each large size (over the largest when none reaches 10k): at 1k the baseline's noise
        # is as large as the objects
        slopes = {top: Metric(f"c RSS per cached object, slope N=0 → {top:,}", "KiB", "≤ 20 KiB", lambda v: v <= 20)
                  for top in ([x for x in sizes if x >= 10000] or sizes[-1:])}
        base = Metric("c RSS with no objects (baseline)", "MiB", "≤ 50 MB", lambda v: v <= 47.7)
        by: dict[tuple[str, str], dict[int, float]] = {}
        for r in c:
            by.setdefault((r["operator"], r["run"]), {}).setdefault(int(r["n"]), float(r["rss_kib"]))
        for (op, _run), vals in by.items():
            if 0 in vals:
                base.add(op, vals[0] / 1024)
            for top, m in slopes.items():
                if 0 in vals and top in vals:
                    m.add(op, (vals[top] - vals[0]) / top)
        rows += [*slopes.values(), base]
        for n in [x for x in sizes if x > 0]:
            peak = Metric(f"c peak RSS (VmHWM) after the cold start, N={n:,}", "MiB")
            for r in c:
                if int(r["n"]) == n and num(r.get("hwm_kib")) is not None:
                    peak.add(r["operator"], float(r["hwm_kib"]) / 1024)
            if peak.values:
                rows.append(peak)

    d = read(out, "d")
    churn_windows = sorted({r["window"] for r in d if r["window"].startswith("churn")},
                           key=lambda w: float(w.split()[1].rstrip("/s")))
    for w in churn_windows[:1] or []:
        reads = Metric(f"d API reads (GET+LIST) per reconcile, {w}", "req", "0", lambda v: v == 0, digits=2)
        writes = Metric(f"d API writes (POST/PUT/PATCH/DELETE) per reconcile, {w}", "req", digits=2)
        for r in d:
            if r["window"] == w:
                recs = num(r["reconciles"]) or 0
                if recs:
                    reads.add(r["operator"], (int(r["req_get"]) + int(r["req_list"])) / recs)
                    writes.add(r["operator"], sum(int(r[f"req_{v}"]) for v in ("create", "update", "patch",
                                                                                   "delete")) / recs)
        rows += [reads, writes]
    idle = Metric("d idle requests per minute", "req/min", "≈ 0 (no leader election)", lambda v: v <= 1)
    idle_cpu = Metric("d idle CPU", "cores", "< 0.01", lambda v: v < 0.01, digits=2)
    for r in d:
        if r["window"] == "idle":
            total = sum(int(r[f"req_{v}"]) for v in ("get", "list", "watch", "create", "update", "patch",
                                                       "delete", "other"))
            idle.add(r["operator"], total / float(r["seconds"]) * 60)
            idle_cpu.add(r["operator"], num(r["cpu_cores"]))
    rows += [idle, idle_cpu]

    e = read(out, "e")
    for case, target, check in (("busy", "2", lambda v: v == 2), ("idle burst", "1–2", lambda v: 1 <= v <= 2)):
        m = Metric(f"e reconciles for 100 updates, {case}" + (" (one 2 s reconcile)" if case == "busy" else ""),
                   "reconciles", target, check, digits=3)
        for r in e:
            if r["case"] == case:
                m.add(r["operator"], num(r["reconciles"]))
        rows.append(m)

    f = read(out, "f")
    for n in sorted({int(r["n"]) for r in f}):
        # the plan's targets stop at 10k; the 100k row has none (its a2 target is in a2)
        target = ("≤ 1 s", 1.0) if n <= 1000 else ("≤ 3 s", 3.0) if n <= 10000 else ("", None)
        m = Metric(f"f process start → first reconcile, N={n:,}" + (" (+1 probe object)" if n == 0 else ""), "s",
                   target[0], None if target[1] is None else (lambda v, t=target[1]: v <= t))
        for r in f:
            if int(r["n"]) == n:
                m.add(r["operator"], num(r["start_to_first_reconcile_s"]))
        rows.append(m)

    g = read(out, "g")
    for n in sorted({int(r["n"]) for r in g}):
        m = Metric(f"g longest event-loop stall during a2, N={n:,}", "ms", "≤ 100 ms", lambda v: v <= 100,
                   note="declop: in-process probe run (bench/ops/declop_inproc.py); Go: n/a")
        for r in g:
            if int(r["n"]) == n:
                m.add(PROBES.get(r["operator"], r["operator"]), num(r["max_stall_ms"]))
        rows.append(m)
        if any(r.get("stall_loop_cpu_ms") for r in g if int(r["n"]) == n):
            # the same tick's CPU: near the lateness, the loop was working; far below, the process
            # waited for a core (the operator shares 2 cores with the apiserver and the load)
            m = Metric(f"g loop-thread CPU during that longest stall, N={n:,}", "ms")
            for r in g:
                if int(r["n"]) == n:
                    m.add(PROBES.get(r["operator"], r["operator"]), num(r.get("stall_loop_cpu_ms")))
            rows.append(m)

    rows += scaleout_rows(out) + priority_rows(out) + metadata_rows(out)

    h = read(out, "h")  # bench/admission.py
    for rate in sorted({float(r["rate"]) for r in h}):
        at = [r for r in h if float(r["rate"]) == rate]
        products = [r for r in at if r["operator"] in ADMISSION_COLUMNS]
        none = [x for r in at if r["operator"] == "none" and (x := num(r["client_p50_ms"])) is not None]
        baseline = f"; no webhook: {_f(statistics.median(none), 2)} ms" if none else ""
        for title, key, unit, digits in [
            (f"h admission p50 at the apiserver (webhook histogram), {rate:g} updates/s", "p50_ms", "ms", 2),
            (f"h admission p99 at the apiserver (webhook histogram), {rate:g} updates/s", "p99_ms", "ms", 2),
            (f"h admission mean at the apiserver (histogram sum ÷ count: exact), {rate:g} updates/s", "mean_ms", "ms", 2),
            (f"h admission reviews ≤ 5 ms (webhook histogram), {rate:g} updates/s", "share_le_5ms", "share", 2),
            (f"h update p50 seen by the client, {rate:g} updates/s{baseline}", "client_p50_ms", "ms", 2),
            (f"h update p99 seen by the client, {rate:g} updates/s", "client_p99_ms", "ms", 2),
            (f"h webhook process CPU per 1k reviews, {rate:g} updates/s", "cpu_s_per_1k_reviews", "s", 2),
        ]:
            m = Metric(title, unit, digits=digits)
            for r in products:
                m.add(ADMISSION_COLUMNS[r["operator"]], num(r[key]))
            rows.append(m)
    return rows


def scaleout_rows(out: Path) -> list[Metric]:
    """The scale-out rows (bench/scaleout.py in ``out/scaleout``): per mode and replica count, each
    replica's CPU in the churn window and its RSS; every replica of every run is one value."""
    folder = out / "scaleout"
    if not (folder / "raw.json").exists():
        return []
    raw = json.loads((folder / "raw.json").read_text())
    st = raw["settings"]
    rows: list[Metric] = []
    for mode in st["modes"]:
        where = "apiserver-side" if mode == "server" else "client-side"
        for k in st["replicas"]:
            at = [r for r in raw["rows"] if r["mode"] == mode and int(r["replicas"]) == k]
            cpu = Metric(f"scale-out CPU per replica, {k} replica(s) of {st['shards']} ranges, {where} filtering, "
                         f"{st['rate']:g} updates/s over {st['n']:,} objects for {st['seconds']:g} s", "s")
            rss = Metric(f"scale-out RSS per replica, {k} replica(s), {where} filtering, {st['n']:,} objects", "MiB")
            for r in at:
                cpu.add("declop", num(r["cpu_s"]))
                rss.add("declop", num(r["rss_mib"]))
            rows += [cpu, rss]
    return rows


def priority_rows(out: Path) -> list[Metric]:
    """The priority rows (bench/priority.py in ``out/priority``): the restart and starvation scenarios,
    one row per queue variant (all declop: the variants are its queue's settings)."""
    rows: list[Metric] = []
    restart = read(out / "priority", "priority_restart")
    for n, handler, queue in sorted({(int(r["n"]), float(r["handler_ms"]), r["queue"]) for r in restart}):
        m = Metric(f"priority: restart with {n:,} objects, a new object's create → its reconcile, "
                   f"{handler:g} ms handler, {queue} queue", "s")
        for r in restart:
            if (int(r["n"]), float(r["handler_ms"]), r["queue"]) == (n, handler, queue):
                m.add("declop", num(r["new_object_reconciled_after_s"]))
        rows.append(m)
    for r in read(out / "priority", "priority_starvation"):
        head = (f"priority: starvation, {int(r['low_keys']):,} low keys under {num(r['normal_rate']):g} normal "
                f"events/s for {num(r['window_s']):g} s, {r['queue']} queue")
        low = Metric(f"{head}: low keys reconciled in the window", "keys", digits=4)
        low.add("declop", num(r["low_reconciled_in_window"]))
        wait = Metric(f"{head}: longest wait of a low key (inf: starved)", "s")
        wait.add("declop", float(r["low_max_wait_s"]))
        p99 = Metric(f"{head}: p99 wait of a normal event", "s")
        p99.add("declop", num(r["normal_p99_wait_s"]))
        rows += [low, wait, p99]
    return rows


def metadata_rows(out: Path) -> list[Metric]:
    """The metadata-only rows (bench/metadata_rss.py, ``out/metadata_rss.json``): bytes of RSS per cached
    object with the whole object cached and with metadata only, one informer in a fresh process."""
    path = out / "metadata_rss.json"
    if not path.exists():
        return []
    results = json.loads(path.read_text())
    rows: list[Metric] = []
    for mode, title in (("whole", "whole objects"), ("metadata_only", "metadata only")):
        at = [r for r in results if r["mode"] == mode and not r["traced"]]
        if not at:
            continue
        m = Metric(f"metadata-only: RSS per cached object, one informer, {at[0]['objects']:,} objects, {title}", "KiB")
        for r in at:
            m.add("declop", r["per_object"] / 1024)
        rows.append(m)
    return rows


def table(out: Path, meta: dict[str, Any]) -> str:
    rows = metrics(out, meta)
    if "runs" not in meta.get("settings", {}):  # bench/admission.py alone: only the rows it measured
        rows = [m for m in rows if m.values]
    present = [c for c in COLUMNS if any(c in m.values for m in rows)]
    head = ["scenario", "unit", *[TITLES[c] for c in present],
            *[f"declop ÷ {t}" for c, t in RATIO_VS if c in present], "target (declop)", "declop", "runs"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in rows:
        cells = [m.title, m.unit, *[m.cell(c) for c in present], *[m.ratio(c) for c, _ in RATIO_VS if c in present],
                 m.target, m.verdict(), m.runs()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def environment(meta: dict[str, Any]) -> str:
    s = meta.get("settings", {})
    lines = _environment(meta, s)
    if "runs" not in s:  # a folder of bench/admission.py alone: no run.py settings to describe
        lines = [line for line in lines if not line.startswith("- **Settings:**")]
    h = s.get("admission")
    if h:
        lines.append(
            f"- **h (bench/admission.py):** {h.get('runs')} run(s); {h.get('rate'):g} merge-patch updates/s for "
            f"{h.get('seconds'):g} s over {h.get('objects')} ConfigMaps of ~{h.get('size_bytes')} B, each admitted "
            f"by the operator's no-op validator (plain def, failurePolicy Ignore, local URL, its own TLS); latency "
            f"from the apiserver's `apiserver_admission_webhook_admission_duration_seconds` histogram (buckets "
            f"5 ms, 25 ms, 100 ms…: quantiles interpolated inside a bucket, so a p50 in the first bucket is "
            f"2.5 ms ÷ the share ≤ 5 ms and says no more than that share; the client's update latency beside the "
            f"no-webhook baseline is the finer figure), client figures from the load generator."
        )
    return "\n".join(lines)


def _environment(meta: dict[str, Any], s: dict[str, Any]) -> list[str]:
    return [
        f"- **Machine:** {meta.get('cpu')}, {meta.get('vcpus')} vCPU, {meta.get('memory')} RAM, Linux "
        f"{meta.get('kernel')}; everything (etcd, kube-apiserver, load generator, operator) on the same host.",
        f"- **Versions:** declop {meta.get('declop')} (commit {meta.get('declop_commit')}"
        f"{', declop/ modified' if meta.get('declop_dirty') else ''}), CPython {meta.get('python')}, orjson "
        f"{meta.get('orjson')}, aiohttp {meta.get('aiohttp')}; Kopf {meta.get('kopf')}; controller-runtime "
        f"{meta.get('controller_runtime')} with client-go {meta.get('client_go')} ({meta.get('go')}); "
        f"Kubernetes {meta.get('kubernetes')}, {meta.get('etcd')}.",
        f"- **Settings:** {s.get('runs')} run(s) per figure (median, min–max when > 1); objects "
        f"{s.get('resource')} of ~{s.get('size_bytes')} B payload; a1 N={s.get('a1_sizes')}; cold N={s.get('cold_sizes')}; "
        f"churn {s.get('rates')} updates/s over {s.get('churn_objects')} objects for {s.get('churn_seconds')} s each; "
        f"idle window {s.get('idle_seconds')} s; e: {s.get('burst')} updates, one reconcile blocking "
        f"{s.get('block_ms')} ms. Every operator: defaults, one namespace, its own client-cert user and "
        f"User-Agent {meta.get('user_agents', {})}.",
        (f"- **Wall time of this run:** {meta.get('wall_seconds')} s." if meta.get("wall_seconds") else
         "- **Wall time of this run:** not recorded (the harness did not finish).") +
        (" **declop/ changed while this run was going on**: lifecycles before and after the change "
         "measured different code." if meta.get("declop_changed_during_run") else "") +
        (f" **Interrupted** {meta['interrupted']}: figures cover the lifecycles completed before that "
         f"(the runs column counts them)." if meta.get("interrupted") else "") +
        (f" **Failed measurements:** {meta.get('failures')}" if meta.get("failures") else ""),
    ]


def plots(out: Path, meta: dict[str, Any]) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    made = []
    raw = out / "raw"
    rates = sorted({float(p.name.split("_")[3]) for p in raw.glob("b_*_e2e_*.csv.gz")}) if raw.exists() else []
    if rates:
        fig, axes = plt.subplots(1, len(rates), figsize=(6 * len(rates), 4.2), squeeze=False)
        for ax, rate in zip(axes[0], rates):
            for op in [*COLUMNS, "declop-inproc"]:
                for kind in ("e2e", "in-process"):
                    vals = []
                    pattern = f"b_{op}_{kind}_{rate:g}_r*.csv.gz"
                    if kind == "in-process":  # the synthetic watch at the largest cache size
                        found = sorted(raw.glob(f"b_{op}_{kind}_{rate:g}_n*_r*.csv.gz"))
                        if found:
                            top = max(int(f.name.split("_n")[-1].split("_")[0]) for f in found)
                            pattern = f"b_{op}_{kind}_{rate:g}_n{top}_r*.csv.gz"
                    for p in sorted(raw.glob(pattern)):
                        with gzip.open(p, "rt") as fh:
                            for row in csv.DictReader(fh):
                                if row["latency_us"]:
                                    vals.append(max(int(row["latency_us"]), 1) / 1000)
                    if not vals or (op == "declop-inproc" and kind == "e2e"):
                        continue
                    vals.sort()
                    ys = [(i + 1) / len(vals) for i in range(len(vals))]
                    label = TITLES.get(op, op) if kind == "e2e" else "declop in-process (synthetic watch)"
                    ax.plot(vals, ys, label=label, linestyle="--" if kind == "in-process" else "-")
            ax.set_xscale("log")
            ax.set_xlabel("update sent (solid) or received (dashed) → reconcile start (ms, log)")
            ax.set_ylabel("share of updates")
            ax.set_title(f"b: {rate:g} updates/s over {meta.get('settings', {}).get('churn_objects')} objects")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7, loc="best")
        fig.tight_layout()
        fig.savefig(out / "b_latency_cdf.png", dpi=90)
        plt.close(fig)
        made.append("b_latency_cdf.png")
    c = read(out, "c")
    if c:
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        for op in COLUMNS:
            by_n: dict[int, list[float]] = {}
            for r in c:
                if r["operator"] == op:
                    by_n.setdefault(int(r["n"]), []).append(float(r["rss_kib"]) / 1024)
            if not by_n:
                continue
            ns = sorted(by_n)
            med = [statistics.median(by_n[n]) for n in ns]
            lo = [med[i] - min(by_n[n]) for i, n in enumerate(ns)]
            hi = [max(by_n[n]) - med[i] for i, n in enumerate(ns)]
            ax.errorbar(ns, med, yerr=[lo, hi], marker="o", capsize=3, label=TITLES[op])
        ax.set_xlabel("cached objects (N)")
        ax.set_ylabel("RSS after sync (MiB)")
        ax.set_title("c: RSS vs cached objects")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "c_rss.png", dpi=90)
        plt.close(fig)
        made.append("c_rss.png")
    return made


def write(out: Path) -> str:
    meta = json.loads((out / "meta.json").read_text())
    pics = plots(out, meta)
    s = meta.get("settings", {})
    mode = "make bench-quick" if s.get("quick") else "make bench" if "runs" in s else "python bench/admission.py"
    text = "\n".join([
        f"# declop benchmark — {meta.get('date')} (`{mode}`)",
        "",
        "Generated by `bench/report.py` from the CSVs in this folder"
        + ("; raw per-update latencies are in `raw/`." if (out / "raw").exists() else "."),
        "Cells: median of the runs (min–max when more than one). Ratios: declop's median ÷ the other's.",
        "Method, fairness and caveats: [bench/README.md](../../README.md).",
        "",
        table(out, meta),
        "",
        environment(meta),
        "",
        *[f"![{p}]({p})" for p in pics],
        "",
    ])
    (out / "summary.md").write_text(text)
    return text


def readme_section(out: Path) -> str:
    """The README section (bench/README-section.md): the same table, from one results folder."""
    meta = json.loads((out / "meta.json").read_text())
    s = meta.get("settings", {})
    rel = out.resolve().relative_to(Path(__file__).resolve().parent)
    text = "\n".join([
        "## Performance",
        "",
        f"declop against Kopf (both handler styles, with and without Event posting) and a controller-runtime "
        f"no-op controller (asking for protobuf, its default for built-in kinds, and reading JSON as declop "
        f"does), on one local kube-apiserver, same no-op logic, each a separate process, and "
        f"declop's own scenarios (scale-out, priority queue, admission webhook against Kopf's, metadata-only "
        f"cache), all from one `make bench` on commit {meta.get('declop_commit')} "
        f"(`make bench-quick`: the same table at reduced sizes, about 8 minutes). Figures from "
        f"[bench/{rel}](bench/{rel}/summary.md): median and min–max of up to {s.get('runs')} runs (the runs "
        f"column says how many each figure has"
        + (f"; the run was interrupted {meta['interrupted']}" if meta.get("interrupted") else "")
        + "); method and caveats in [bench/README.md](bench/README.md), misses and fixes in "
        "[bench/FINDINGS.md](bench/FINDINGS.md).",
        "",
        table(out, meta).replace("](", "](bench/" + str(rel) + "/"),
        "",
        environment(meta),
        "",
    ])
    (Path(__file__).resolve().parent / "README-section.md").write_text(text)
    return text


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "--readme":
        print(readme_section(Path(args[1])))
    else:
        for arg in args:
            print(write(Path(arg)))
