"""Scale-out: CPU, RSS and watch events per replica of a sharded declop, 1/2/4 replicas.

    python bench/scaleout.py --n 1000 --seconds 10                   # quick: 1k objects
    python bench/scaleout.py --n 10000 --runs 3                     # the issue's size
    python bench/scaleout.py --summary bench/results/<dir>          # rebuild summary.md from raw.json

For each filtering mode, one local control plane (bench/lib.py, etcd + kube-apiserver v1.36):
``server`` with the ``ShardedListAndWatch`` feature gate on (the apiserver sends each replica
only its ranges), ``client`` with it off (every replica receives everything and drops what is
not its own before the cache). N ConfigMaps of ~6 KB are created once per control plane
(bench/loadgen). Then, for each replica count and run, a fresh lifecycle:

1. ``k`` processes ``declop run bench/ops/declop_noop.py --shards 16`` start together (the
   benchmark's no-op reconciler, short Lease timings, a Lease id of their own, plain-HTTP
   /metrics on distinct ports);
2. owned: the 16 range Leases are held by the k replicas' identities, each holding its share
   (``ceil(16/k)`` or one less), and their caches hold N objects in all
   (``declop_informer_objects``) — the time from the spawn to this is ``owned_s``; then settled:
   every object was reconciled once and no reconcile was logged for 2 s;
3. an idle window (``--idle-seconds``, no writes): each replica's CPU with nothing but its Lease
   rounds to do; then the window: the load generator's paced merge patches at ``--rate`` for ``--seconds``,
   round-robin over the N objects, until every written object was reconciled at its last
   written ``bench/seq`` (or 60 s more);
4. per replica: CPU seconds in the window (utime + stime, /proc/<pid>/stat), VmRSS at its end,
   watch events received (``declop_informer_events_received_total``, difference of two
   scrapes), objects cached (``declop_informer_objects``), ranges owned, reconciles logged in
   the window; and the kube-apiserver's own CPU seconds in the window.

Writes ``raw.json`` (settings, machine, every measurement), ``scaleout.csv`` (one row per
replica) and ``summary.md``, which ``summarize`` computes from raw.json alone.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import socket
import statistics
import sys
import time
import urllib.request
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib import (
    BENCH,
    CONFIGMAPS,
    LOADGEN,
    BenchControlPlane,
    LoadGen,
    OperatorProcess,
    OperatorSpec,
    go_build,
    progress,
    wait_until,
)  # fmt: skip

SHARDS = 16
LEASE = ("4", "3", "0.5")  # --lease-duration, --renew-deadline, --retry-period (as the integration tests)
MODES = {"server": True, "client": False}  # filtering mode -> the ShardedListAndWatch gate
PREFIX = "obj-"
_SAMPLE = re.compile(r"^(\w+)(?:\{([^}]*)\})? ([0-9.eE+-]+|\+Inf|NaN)$")


@dataclass
class ShardedSpec(OperatorSpec):
    """The benchmark's declop operator with extra ``declop run`` arguments (sharding, metrics)."""

    extra: tuple[str, ...] = ()

    def argv(self, ns: str, kubeconfig: str) -> list[str]:
        return [*super().argv(ns, kubeconfig), *self.extra]


def metric_sums(text: str) -> dict[str, float]:
    """Prometheus text -> {metric name: sum over all its label sets} (comments skipped)."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        found = _SAMPLE.match(line)
        if found:
            sums[found.group(1)] = sums.get(found.group(1), 0.0) + float(found.group(3))
    return sums


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pid_cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (all threads), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Replica:
    """One ``declop run --shards`` process: its metrics port, identity and measurements."""

    def __init__(self, name: str, ns: str, kubeconfig: str, lease_id: str, workdir: Path) -> None:
        self.name = name
        self.port = free_port()
        extra = ("--shards", str(SHARDS), "--leader-election-id", lease_id, "--leader-election-namespace", ns,
                 "--lease-duration", LEASE[0], "--renew-deadline", LEASE[1], "--retry-period", LEASE[2],
                 "--grace-period", "5", "--metrics-port", str(self.port), "--metrics-secure=false",
                 "--log-format", "json")  # fmt: skip
        spec = ShardedSpec(name, name, "declop", extra=extra)
        self.proc = OperatorProcess(spec, ns, kubeconfig, workdir / name, CONFIGMAPS)
        self.identity = ""

    def find_identity(self) -> str:
        """The replica's Lease identity, from its ``Sharding: joining`` log line ("" until then)."""
        if not self.identity:
            for line in (self.proc.workdir / "operator.log").read_text(errors="replace").splitlines():
                if line.startswith("{") and '"Sharding: joining"' in line:
                    self.identity = str(json.loads(line).get("identity", ""))
                    break
        return self.identity

    def metrics(self) -> dict[str, float]:
        """This replica's /metrics, summed by name; {} while it does not answer yet."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as resp:
                return metric_sums(resp.read().decode())
        except OSError:
            return {}


def range_holders(cp: BenchControlPlane, ns: str, lease_id: str) -> dict[int, str]:
    """Range index -> holder identity ("" when free), from the Leases ``<id>-<controller>-shard-i-of-16``."""
    out: dict[int, str] = {}
    for lease in cp.json("GET", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases")["items"]:
        name = lease["metadata"]["name"]
        if name.startswith(lease_id + "-") and name.endswith(f"-of-{SHARDS}") and "-shard-" in name:
            index = int(name.rsplit("-shard-", 1)[1].split("-of-")[0])
            out[index] = lease["spec"].get("holderIdentity") or ""
    return out


def owned(cp: BenchControlPlane, ns: str, lease_id: str, replicas: list[Replica], n: int) -> bool:
    """Every range held by a live replica, each holding its share, and N objects cached in all."""
    ids = [r.find_identity() for r in replicas]
    if "" in ids or any(not r.proc.alive() for r in replicas):
        return False
    holders = range_holders(cp, ns, lease_id)
    if len(holders) < SHARDS or any(h not in ids for h in holders.values()):
        return False
    share = -(-SHARDS // len(replicas))
    counts = [sum(1 for h in holders.values() if h == i) for i in ids]
    if any(not share - 1 <= c <= share for c in counts):
        return False
    return sum(r.metrics().get("declop_informer_objects", 0.0) for r in replicas) == n


def last_seq_reconciled(replicas: list[Replica], want: dict[str, int]) -> bool:
    """Every ``<ns>/<name>`` of ``want`` was reconciled (by any replica) with a seq ≥ its value."""
    best: dict[str, int] = {}
    for r in replicas:
        r.proc.log.poll()
        for _, key, seq in r.proc.log.lines:
            if seq.isdigit() and int(seq) > best.get(key, -1):
                best[key] = int(seq)
    return all(best.get(key, -1) >= seq for key, seq in want.items())


def lifecycle(
    cp: BenchControlPlane,
    gen: LoadGen,
    mode: str,
    k: int,
    run: int,
    ns: str,
    kubeconfig: str,
    args: argparse.Namespace,
    seq: int,
    work: Path,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One measurement: k replicas started, owned and settled, one churn window. Rows per replica."""
    lease_id = f"scale-{mode}-k{k}-r{run}"
    t_spawn = time.monotonic()
    replicas = [Replica(f"{lease_id}-{i}", ns, kubeconfig, lease_id, work) for i in range(k)]
    try:

        def ticker() -> None:
            progress(
                f"    waiting: holders {sorted(set(range_holders(cp, ns, lease_id).values()))}, cached "
                f"{[r.metrics().get('declop_informer_objects') for r in replicas]}"
            )

        if not wait_until(lambda: owned(cp, ns, lease_id, replicas, args.n), 300, tick=0.25, on_tick=ticker, every=10):
            raise RuntimeError(f"{lease_id}: ranges not owned in 300 s; last log lines:\n{replicas[0].proc.tail()}")
        owned_s = time.monotonic() - t_spawn

        def settled() -> bool:
            keys: set[str] = set()
            newest = 0
            for r in replicas:
                r.proc.log.poll()
                keys.update(key for _, key, _ in r.proc.log.lines)
                newest = max([newest, *(t for t, _, _ in r.proc.log.lines[-1:])])
            return len(keys) >= args.n and time.time_ns() - newest > 2e9

        if not wait_until(settled, 300, tick=0.25):
            raise RuntimeError(f"{lease_id}: initial reconciles did not settle in 300 s")
        settled_s = time.monotonic() - t_spawn
        progress(f"  {mode} k={k} run {run}: owned after {owned_s:.1f} s, settled after {settled_s:.1f} s")

        # an idle window first: what a replica costs with nothing to do (Lease renewals every retry period)
        idle0 = [r.proc.cpu_seconds() for r in replicas]
        t_idle = time.monotonic()
        time.sleep(args.idle_seconds)  # a measurement window, not a wait for a condition
        idle_s = time.monotonic() - t_idle
        idle_cpu = [r.proc.cpu_seconds() - c for r, c in zip(replicas, idle0)]
        apiserver = cp.pids["kube-apiserver"]
        before = [(r.metrics(), r.proc.cpu_seconds(), len(r.proc.log.lines)) for r in replicas]
        api_cpu0 = pid_cpu_seconds(apiserver)
        t0 = time.monotonic()
        t0_ns = time.time_ns()
        writes = gen.churn(ns, PREFIX, args.n, args.rate, args.seconds, seq)
        churn_s = time.monotonic() - t0
        ok = [w for w in writes if 200 <= w.status < 300]
        want: dict[str, int] = {}
        for w in ok:
            key = f"{ns}/{w.name}"
            want[key] = max(want.get(key, -1), w.seq)
        caught_up = wait_until(lambda: last_seq_reconciled(replicas, want), 60, tick=0.1)
        window_s = time.monotonic() - t0
        api_cpu = pid_cpu_seconds(apiserver) - api_cpu0
        rows = []
        for r, (m0, cpu0, _), idle in zip(replicas, before, idle_cpu):
            if not r.proc.alive():
                raise RuntimeError(f"{r.name} exited during the window:\n{r.proc.tail()}")
            m1 = r.metrics()
            rss, hwm = r.proc.rss_kib()
            rows.append({
                "mode": mode, "replicas": k, "run": run, "replica": r.name,
                "ranges_owned": m1.get("declop_shard_ranges_owned", math.nan),
                "cpu_s": r.proc.cpu_seconds() - cpu0,
                "idle_cpu_s": idle,
                "rss_mib": rss / 1024, "hwm_mib": hwm / 1024,
                "events_received": m1.get("declop_informer_events_received_total", math.nan)
                - m0.get("declop_informer_events_received_total", math.nan),
                "shard_dropped": m1.get("declop_informer_shard_dropped_total", math.nan)
                - m0.get("declop_informer_shard_dropped_total", math.nan),
                "objects_cached": m1.get("declop_informer_objects", math.nan),
                "server_side": m1.get("declop_informer_shard_server_side", math.nan),
                "reconciles": sum(1 for t, _, _ in r.proc.log.lines if t >= t0_ns),
            })  # fmt: skip
        lc = {"mode": mode, "replicas": k, "run": run, "owned_s": owned_s, "settled_s": settled_s,
              "writes": len(writes), "failed_writes": len(writes) - len(ok), "churn_s": churn_s,
              "window_s": window_s, "idle_s": idle_s, "caught_up": caught_up, "apiserver_cpu_s": api_cpu}  # fmt: skip
        progress(
            f"  {mode} k={k} run {run}: {len(ok)} writes in {churn_s:.1f} s, window {window_s:.1f} s; "
            f"events {[int(r['events_received']) for r in rows]}, cached {[int(r['objects_cached']) for r in rows]}, "
            f"CPU {[round(r['cpu_s'], 1) for r in rows]} s, RSS {[round(r['rss_mib']) for r in rows]} MiB"
        )
        return rows, lc
    finally:
        for r in replicas:
            r.proc.stop()


# ------------------------------------------------------------------------------ summary


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def _spread(values: list[float], fmt: str) -> str:
    """``median (min–max)`` of ``values``, or the one value."""
    if not values:
        return "–"
    med = format(_median(values), fmt)
    return med if len(values) == 1 else f"{med} ({format(min(values), fmt)}–{format(max(values), fmt)})"


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}×" if base and not math.isnan(base) and not math.isnan(value) else "–"


def aggregate(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (mode, replicas): per-run means over the replicas, then medians over the runs.

    Per run: ``events``, ``cached``, ``cpu``, ``rss``, ``reconciles`` are means over the replicas
    of that run; ``cpu_total`` the sum over them; ``share`` events ÷ successful writes; the
    apiserver CPU and startup times are per lifecycle. Lists keep every run's value (for min–max).
    """
    out = []
    lifecycles = {(lc["mode"], lc["replicas"], lc["run"]): lc for lc in raw["lifecycles"]}
    for mode in raw["settings"]["modes"]:
        for k in raw["settings"]["replicas"]:
            per_run: dict[str, list[float]] = {}
            for (m, kk, run), lc in sorted(lifecycles.items()):
                if (m, kk) != (mode, k):
                    continue
                rows = [r for r in raw["rows"] if (r["mode"], r["replicas"], r["run"]) == (m, kk, run)]
                ok_writes = lc["writes"] - lc["failed_writes"]
                values = {
                    "events": statistics.mean(r["events_received"] for r in rows),
                    "share": statistics.mean(r["events_received"] for r in rows) / ok_writes if ok_writes else math.nan,
                    "cached": statistics.mean(r["objects_cached"] for r in rows),
                    "cpu": statistics.mean(r["cpu_s"] for r in rows),
                    "cpu_total": sum(r["cpu_s"] for r in rows),
                    "idle_cores": statistics.mean(r["idle_cpu_s"] for r in rows) / lc["idle_s"],
                    "rss": statistics.mean(r["rss_mib"] for r in rows),
                    "reconciles": statistics.mean(r["reconciles"] for r in rows),
                    "apiserver_cpu": lc["apiserver_cpu_s"],
                    "owned_s": lc["owned_s"],
                    "window_s": lc["window_s"],
                    "rate": ok_writes / lc["churn_s"],
                }
                for name, v in values.items():
                    per_run.setdefault(name, []).append(v)
            if per_run:
                out.append({"mode": mode, "replicas": k, "runs": len(per_run["cpu"]), **per_run})
    return out


def reading(agg: list[dict[str, Any]]) -> list[str]:
    """One sentence per mode comparing its largest replica count with one replica (medians of ``agg``).

    The RSS per cached object is the slope between the two (``(RSS(1) - RSS(k)) / (cached(1) -
    cached(k))``), and the part of a replica's RSS that does not shrink is RSS(1) minus that slope
    times the objects one replica caches: what the ratios of RSS tend to instead of ``1/k``.
    """
    out = []
    for mode in dict.fromkeys(a["mode"] for a in agg):
        rows = sorted((a for a in agg if a["mode"] == mode), key=lambda a: a["replicas"])
        one, top = rows[0], rows[-1]
        if one["replicas"] != 1 or top is one:
            continue
        k = top["replicas"]
        med = {
            key: (_median(one[key]), _median(top[key]))
            for key in ("events", "cpu", "cpu_total", "rss", "cached", "apiserver_cpu")
        }
        slope = (
            (med["rss"][0] - med["rss"][1]) / (med["cached"][0] - med["cached"][1])
            if med["cached"][0] != med["cached"][1]
            else math.nan
        )
        fixed = med["rss"][0] - slope * med["cached"][0]
        label = "Server-side" if mode == "server" else "Client-side"
        out.append(
            f"- **{label}, {k} replicas vs 1:** each replica receives {_ratio(med['events'][1], med['events'][0])} "
            f"the events and caches {_ratio(med['cached'][1], med['cached'][0])} the objects; its CPU in the window is "
            f"{_ratio(med['cpu'][1], med['cpu'][0])} and all replicas together use {_ratio(med['cpu_total'][1], med['cpu_total'][0])} "
            f"the CPU of one; RSS per replica {_ratio(med['rss'][1], med['rss'][0])} ({slope * 1024:,.1f} KiB per cached object "
            f"between the two, {fixed:.0f} MiB that does not shrink); kube-apiserver CPU "
            f"{_ratio(med['apiserver_cpu'][1], med['apiserver_cpu'][0])}."
        )
    return out


def summarize(raw: dict[str, Any]) -> str:
    """summary.md, every figure computed from ``raw`` (raw.json)."""
    s, meta = raw["settings"], raw["meta"]
    agg = aggregate(raw)
    runs = sorted({a["runs"] for a in agg})
    lines = [
        f"# Scale-out with sharding: {s['n']:,} objects, 1/2/4 replicas, server- vs client-side filtering",
        "",
        (
            f"`{raw['command']}` — {meta['date']}. Generated by `bench/scaleout.py` from [raw.json](raw.json) "
            "(one row per replica: [scaleout.csv](scaleout.csv)); nothing typed by hand."
        ),
        "",
        (
            f"Every replica is `declop run bench/ops/declop_noop.py --shards {s['shards']}` (the benchmark's no-op "
            f"reconciler, defaults otherwise; Leases {s['lease']}); the load is {s['rate']:g} merge patches/s for "
            f"{s['seconds']:g} s, round-robin over {s['n']:,} ConfigMaps of ~6 KB. "
            f"Cells: the mean over the replicas of one run, median over {'/'.join(map(str, runs))} run(s) "
            "(min–max when more than one); ratios are to the 1-replica figure of the same mode. "
            "CPU is utime+stime during the window (the churn plus the catch-up until every written object "
            "was reconciled at its last write); RSS is VmRSS at the end of the window. Idle CPU: the same "
            f"replicas over {s['idle_seconds']:g} s with no writes just before (Lease renewals every "
            f"{s['lease'].split('/')[2]})."
        ),
        "",
        (
            "| filtering | replicas | events received per replica | ÷ writes | objects cached per replica "
            "| CPU s per replica | ÷ 1 replica | CPU s, all replicas | RSS MiB per replica | ÷ 1 replica "
            "| reconciles per replica | idle CPU per replica, % of a core | kube-apiserver CPU s "
            "| start → ranges owned s | runs |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = {a["mode"]: a for a in agg if a["replicas"] == 1}
    for a in agg:
        b = base.get(a["mode"])
        label = "server-side (gate on)" if a["mode"] == "server" else "client-side (gate off)"
        lines.append(
            f"| {label} | {a['replicas']} | {_spread(a['events'], ',.0f')} | {_spread(a['share'], '.2f')} "
            f"| {_spread(a['cached'], ',.0f')} | {_spread(a['cpu'], '.2f')} "
            f"| {_ratio(_median(a['cpu']), _median(b['cpu'])) if b else '–'} | {_spread(a['cpu_total'], '.2f')} "
            f"| {_spread(a['rss'], '.0f')} | {_ratio(_median(a['rss']), _median(b['rss'])) if b else '–'} "
            f"| {_spread(a['reconciles'], ',.0f')} | {_spread([100 * c for c in a['idle_cores']], '.1f')} "
            f"| {_spread(a['apiserver_cpu'], '.1f')} "
            f"| {_spread(a['owned_s'], '.1f')} | {a['runs']} |"
        )
    lines += ["", *reading(agg), "", "Per replica (every run):", "",
              ("| filtering | replicas | run | replica | ranges | events received | dropped by the filter "
              "| objects cached | CPU s | idle CPU s | RSS MiB | reconciles |"),
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in raw["rows"]:
        lines.append(
            f"| {r['mode']} | {r['replicas']} | {r['run']} | {r['replica'].rsplit('-', 1)[1]} | {r['ranges_owned']:.0f} "
            f"| {r['events_received']:,.0f} | {r['shard_dropped']:,.0f} | {r['objects_cached']:,.0f} "
            f"| {r['cpu_s']:.2f} | {r['idle_cpu_s']:.2f} | {r['rss_mib']:.0f} | {r['reconciles']:,.0f} |"
        )
    lifecycles = raw["lifecycles"]
    lines += [
        "",
        "Windows: "
        + "; ".join(
            f"{lc['mode']} k={lc['replicas']} r{lc['run']}: {lc['writes'] - lc['failed_writes']} writes "
            f"({lc['failed_writes']} failed) in {lc['churn_s']:.1f} s, window {lc['window_s']:.1f} s"
            + ("" if lc["caught_up"] else ", NOT caught up within 60 s")
            for lc in lifecycles
        )
        + ".",
        "",
        (
            "- **No comparison column:** Kopf and controller-runtime have no sharding (controller-runtime "
            "needs an external sharder, timebertt/kubernetes-controller-sharding); their one active replica "
            "is the 1-replica row's situation."
        ),
        (
            f"- **Machine:** {meta['cpu']}, {meta['vcpus']} vCPU, {meta['memory']} RAM; etcd, kube-apiserver, the "
            "load generator and every replica share these cores, and the machine was shared with other work "
            "during the run: CPU seconds are counted per process and are comparable, wall times less so. "
            "The modes ran one after the other, each on its own control plane (server-side first)."
        ),
        (
            "- **RSS after a handover:** replicas start together, and one may own more ranges for a moment "
            "before the others join; its allocator keeps some of that memory (VmRSS at the end, VmHWM in raw.json)."
        ),
        (
            f"- **Versions:** declop {meta['declop']} (commit {meta['declop_commit']}), CPython {meta['python']}, "
            f"Kubernetes {meta['kubernetes']}."
        ),
    ]
    return "\n".join(lines) + "\n"


def write_outputs(out: Path, raw: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "raw.json").write_text(json.dumps(raw, indent=1))
    if raw["rows"]:
        with open(out / "scaleout.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(raw["rows"][0]))
            w.writeheader()
            for row in raw["rows"]:
                w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
    (out / "summary.md").write_text(summarize(raw))


def machine(cp: BenchControlPlane) -> dict[str, Any]:
    from run import machine_facts

    class _Settings:
        def as_dict(self) -> dict[str, Any]:
            return {}

    facts = machine_facts(cp, _Settings())  # type: ignore[arg-type]
    facts["kubernetes"] = cp.json("GET", "/version").get("gitVersion", "?")
    return facts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000, help="ConfigMaps (default 1000; the issue's size: 10000)")
    ap.add_argument("--replicas", default="1,2,4", help="replica counts (default 1,2,4)")
    ap.add_argument("--modes", default="server,client", help="filtering modes (default server,client)")
    ap.add_argument("--rate", type=float, default=100.0, help="updates per second (default 100)")
    ap.add_argument("--seconds", type=float, default=30.0, help="churn window (default 30)")
    ap.add_argument("--idle-seconds", type=float, default=10.0, help="idle window before the churn (default 10)")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--out", help=f"results folder (default bench/results/{date.today().isoformat()}-scaleout)")
    ap.add_argument("--summary", metavar="DIR", help="only rebuild DIR/summary.md from DIR/raw.json")
    args = ap.parse_args(argv)
    if args.summary:
        folder = Path(args.summary)
        (folder / "summary.md").write_text(summarize(json.loads((folder / "raw.json").read_text())))
        return 0
    modes = [m for m in args.modes.split(",") if m]
    if set(modes) - set(MODES):
        ap.error(f"modes are {', '.join(MODES)}")
    counts = [int(k) for k in args.replicas.split(",") if k]
    out = Path(args.out) if args.out else BENCH / "results" / f"{date.today().isoformat()}-scaleout"
    go_build(LOADGEN, "loadgen")
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"declop-bench-scaleout-{os.getpid()}"  # operator logs, kept
    shown = [a for a in sys.argv[1:]] if argv is None else argv
    raw: dict[str, Any] = {
        "command": " ".join(["python bench/scaleout.py", *shown]),
        "settings": {"n": args.n, "replicas": counts, "modes": modes, "rate": args.rate, "seconds": args.seconds,
                     "idle_seconds": args.idle_seconds, "runs": args.runs, "shards": SHARDS,
                     "lease": "/".join(LEASE) + " s", "size_bytes": 6000},
        "meta": {}, "rows": [], "lifecycles": [],
    }  # fmt: skip
    seq = 1
    for mode in modes:
        with BenchControlPlane(controller_manager=False, feature_gates={"ShardedListAndWatch": MODES[mode]}) as cp:
            if not raw["meta"]:
                raw["meta"] = machine(cp)
            kubeconfig = cp.add_user("bench-scaleout", groups=["system:masters"])
            gen = LoadGen(cp, cp.add_user("bench-loadgen", groups=["system:masters"]), CONFIGMAPS, 6000)
            ns = f"scale-{mode}"
            cp.json("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
            progress(f"{mode}: creating {args.n} ConfigMaps")
            created = gen.create(ns, PREFIX, args.n)
            if sum(1 for w in created if 200 <= w.status < 300) != args.n:
                raise RuntimeError(f"{mode}: not every ConfigMap was created")
            for run in range(1, args.runs + 1):
                for k in counts:
                    progress(f"{mode} · {k} replica(s) · run {run}/{args.runs}")
                    rows, lc = lifecycle(cp, gen, mode, k, run, ns, kubeconfig, args, seq, work)
                    seq += int(args.rate * args.seconds * 2) + 1000
                    raw["rows"] += rows
                    raw["lifecycles"].append(lc)
                    write_outputs(out, raw)  # what was measured so far survives an interruption
    write_outputs(out, raw)
    progress(f"wrote {out}/summary.md, raw.json, scaleout.csv (operator logs: {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
