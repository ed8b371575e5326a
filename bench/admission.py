"""Scenario h: admission latency at the apiserver, a declop validator and a Kopf validator.

    python bench/admission.py                          # reduced size: 100 objects, 100 updates/s for 20 s, 1 run
    python bench/admission.py --seconds 60 --runs 3    # the full figures
    python bench/admission.py --out bench/results/<dir>  # add h.csv to a results folder of run.py

One local control plane (etcd + kube-apiserver, bench/lib.py) and, in turn, for each operator:
a fresh namespace with N ConfigMaps of ~6 KB (bench/loadgen, before any webhook exists), the
operator started (declop: ``declop run bench/ops/declop_validator.py``; Kopf: ``kopf run
--standalone -A bench/ops/kopf_validator.py``, each registering its own
ValidatingWebhookConfiguration for configmaps CREATE/UPDATE with the local URL form), a warm-up
until the apiserver has called the webhook, then the load generator's paced merge patches at
``--rate`` for ``--seconds`` (every one admitted through the webhook). The figure is the
apiserver's own ``apiserver_admission_webhook_admission_duration_seconds`` histogram (type
validating, operation UPDATE), the difference of two scrapes around the window: p50/p90/p99 by
linear interpolation inside the bucket, as PromQL's histogram_quantile. Its buckets are coarse
(5 ms, 25 ms, 100 ms, …), so the shares at or below 5 ms and 25 ms are reported too, and, at a
finer grain, the write latency the load generator saw (send → response) next to a baseline
window with no webhook at all.

Writes ``h.csv`` (one row per run and operator, baseline included) and, when the folder has none,
``meta.json``; ``python bench/report.py <folder>`` then renders the h rows of summary.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib import (  # noqa: E402
    BENCH, CONFIGMAPS, KOPF_VENV, LOADGEN, OPS, BenchControlPlane, LoadGen, go_build, kopf_venv, percentiles,
    progress,
)  # fmt: skip

METRIC = "apiserver_admission_webhook_admission_duration_seconds"
OPERATORS = ("declop", "kopf")
CA_NAMESPACE = "bench-webhooks"  # declop keeps its CA Secret here; excluded from its admission
_SAMPLE = re.compile(r'^(\w+)\{([^}]*)\} ([0-9.eE+-]+|\+Inf|NaN)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def histogram(metrics_text: str) -> dict[str, Any]:
    """The validating/UPDATE samples summed over webhook names (one operator's configuration
    exists at a time): {"buckets": {le: cumulative count}, "count", "sum"}."""
    buckets: dict[float, float] = defaultdict(float)
    count = total = 0.0
    for line in metrics_text.splitlines():
        found = _SAMPLE.match(line)
        if not found or not found.group(1).startswith(METRIC):
            continue
        labels = dict(_LABEL.findall(found.group(2)))
        if labels.get("type") != "validating" or labels.get("operation") != "UPDATE":
            continue
        value = float(found.group(3))
        if found.group(1) == METRIC + "_bucket":
            buckets[float(labels["le"])] += value
        elif found.group(1) == METRIC + "_count":
            count += value
        elif found.group(1) == METRIC + "_sum":
            total += value
    return {"buckets": dict(buckets), "count": count, "sum": total}


def delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    return {
        "buckets": {le: n - before["buckets"].get(le, 0.0) for le, n in after["buckets"].items()},
        "count": after["count"] - before["count"],
        "sum": after["sum"] - before["sum"],
    }


def quantile(q: float, buckets: dict[float, float]) -> float:
    """histogram_quantile(q) over cumulative ``buckets`` {le: count}, as Prometheus computes it."""
    ordered = sorted(buckets.items())
    if not ordered or ordered[-1][1] <= 0:
        return float("nan")
    rank = q * ordered[-1][1]
    lower, below = 0.0, 0.0
    for le, cumulative in ordered:
        if cumulative >= rank:
            if le == float("inf"):
                return lower  # in the +Inf bucket: the highest finite bound, as Prometheus
            if cumulative == below:
                return le
            return lower + (le - lower) * (rank - below) / (cumulative - below)
        lower, below = le, cumulative
    return lower


def share_at_most(le: float, buckets: dict[float, float]) -> float:
    total = max(buckets.values(), default=0.0)
    return buckets.get(le, float("nan")) / total if total else float("nan")


class Operator:
    """One webhook process under test, in its own session; stopped by its pid only."""

    def __init__(self, kind: str, kubeconfig: str, port: int, name: str, work: Path) -> None:
        self.kind, self.name = kind, name
        env = dict(os.environ, KUBECONFIG=kubeconfig, BENCH_RESOURCE="configmaps", PYTHONUNBUFFERED="1")
        env.pop("VIRTUAL_ENV", None)
        if kind == "declop":
            argv = [sys.executable, "-m", "declop", "run", str(OPS / "declop_validator.py"), "--kubeconfig", kubeconfig,
                    "--webhook-port", str(port), "--webhook-name", name, "--webhook-namespace", CA_NAMESPACE]
        else:
            from declop.serving.cert import self_signed

            cert, key = self_signed(["127.0.0.1", "localhost"])
            (work / "kopf-tls.crt").write_bytes(cert)
            (work / "kopf-tls.key").write_bytes(key)
            env.update(BENCH_WEBHOOK_PORT=str(port), BENCH_WEBHOOK_NAME=name,
                       BENCH_WEBHOOK_CERT=str(work / "kopf-tls.crt"), BENCH_WEBHOOK_KEY=str(work / "kopf-tls.key"))
            argv = [str(KOPF_VENV / "bin" / "kopf"), "run", "--standalone", "-A", str(OPS / "kopf_validator.py")]
        self.log = open(work / f"{kind}.log", "wb")
        self.popen = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=self.log,
                                      stderr=subprocess.STDOUT, start_new_session=True)

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.popen.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        self.log.close()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(cp: BenchControlPlane, gen: LoadGen, operator: str, run: int, args: argparse.Namespace,
            kubeconfig: str, work: Path) -> dict[str, Any]:
    ns = f"adm-{operator}-r{run}"
    cp.json("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    gen.create(ns, "obj-", args.objects)
    # the configuration's name. declop's is short: its CA's subject holds <namespace>/<name>-webhook-ca
    # (X.509 allows 64 characters); Kopf's needs dots: it names its webhooks <id>.<name>, which
    # the apiserver wants as a domain of three labels or more
    name = "declop-bench" if operator == "declop" else "bench.kopf.dev"
    proc = None if operator == "none" else Operator(operator, kubeconfig, free_port(), name, work)
    seq = 1
    try:
        if proc is not None:  # warm up until the apiserver has called this webhook (registered, TLS up)
            deadline = time.monotonic() + 90
            start = histogram(cp.metrics_text())["count"]
            while histogram(cp.metrics_text())["count"] - start < 10:
                if proc.popen.poll() is not None or time.monotonic() > deadline:
                    log = (work / f"{operator}.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"{operator}: the webhook was never called; its log:\n{log}")
                gen.churn(ns, "obj-", args.objects, 20, 1.0, seq)
                seq += 20
        before = histogram(cp.metrics_text())
        cpu0 = proc.cpu_seconds() if proc else 0.0
        t0 = time.monotonic()
        writes = gen.churn(ns, "obj-", args.objects, args.rate, args.seconds, seq)
        wall = time.monotonic() - t0
        cpu = (proc.cpu_seconds() - cpu0) if proc else float("nan")
        window = delta(histogram(cp.metrics_text()), before)
        if proc is not None and proc.popen.poll() is not None:
            raise RuntimeError(f"{operator} exited during the window; see {work / (operator + '.log')}")
    finally:
        if proc is not None:
            proc.stop()
            for kind in ("validatingwebhookconfigurations", "mutatingwebhookconfigurations"):
                cp.request("DELETE", f"/apis/admissionregistration.k8s.io/v1/{kind}/{name}")
        cp.request("DELETE", f"/api/v1/namespaces/{ns}")
    ok = [w for w in writes if 200 <= w.status < 300]
    client = percentiles([(w.ack - w.send) / 1e6 for w in ok], (50, 99))
    b = window["buckets"]
    return {
        "run": run, "operator": operator, "rate": args.rate, "seconds": args.seconds, "objects": args.objects,
        "writes": len(writes), "failed_writes": len(writes) - len(ok), "achieved_rate": len(writes) / wall,
        "admission_reviews": window["count"],
        "p50_ms": quantile(0.5, b) * 1e3, "p90_ms": quantile(0.9, b) * 1e3, "p99_ms": quantile(0.99, b) * 1e3,
        "mean_ms": window["sum"] / window["count"] * 1e3 if window["count"] else float("nan"),
        "share_le_5ms": share_at_most(0.005, b), "share_le_25ms": share_at_most(0.025, b),
        "client_p50_ms": client["p50"], "client_p99_ms": client["p99"],
        "cpu_s_per_1k_reviews": cpu / window["count"] * 1000 if window["count"] else float("nan"),
        "buckets": json.dumps({("+Inf" if le == float("inf") else f"{le:g}"): n for le, n in sorted(b.items())}),
    }


def write_rows(out: Path, rows: list[dict[str, Any]]) -> None:
    with open(out / "h.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for row in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=100.0, help="updates (admission reviews) per second (default 100)")
    ap.add_argument("--seconds", type=float, default=20.0, help="measured window per operator and run (default 20)")
    ap.add_argument("--objects", type=int, default=100, help="ConfigMaps updated round-robin (default 100)")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--operators", default=",".join(OPERATORS), help="comma list of declop,kopf (default both)")
    ap.add_argument("--out", help=f"results folder (default bench/results/{date.today().isoformat()}-admission)")
    args = ap.parse_args(argv)
    operators = ["none", *[o for o in args.operators.split(",") if o]]
    unknown = set(operators) - {"none", *OPERATORS}
    if unknown:
        ap.error(f"unknown operator(s) {', '.join(sorted(unknown))}; choose from {', '.join(OPERATORS)}")
    out = Path(args.out) if args.out else BENCH / "results" / f"{date.today().isoformat()}-admission"
    out.mkdir(parents=True, exist_ok=True)
    go_build(LOADGEN, "loadgen")
    if "kopf" in operators:
        kopf_venv()
    rows: list[dict[str, Any]] = []
    began = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="declop-bench-admission-"))  # the operators' logs, kept
    with BenchControlPlane(controller_manager=False) as cp:
        kubeconfig = cp.add_user("bench-webhooks", groups=["system:masters"])
        gen = LoadGen(cp, cp.add_user("bench-loadgen", groups=["system:masters"]), CONFIGMAPS, 6000)
        cp.json("POST", "/api/v1/namespaces", {"metadata": {"name": CA_NAMESPACE}})
        for run in range(1, args.runs + 1):
            for operator in operators:
                progress(f"h run {run}/{args.runs} · {operator} · {args.rate:g}/s for {args.seconds:g} s")
                rows.append(measure(cp, gen, operator, run, args, kubeconfig, work))
                r = rows[-1]
                progress(f"  {r['admission_reviews']:.0f} reviews, p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms "
                         f"(≤5 ms {r['share_le_5ms']:.0%}); client p50 {r['client_p50_ms']:.2f} ms")
        settings = {"rate": args.rate, "seconds": args.seconds, "objects": args.objects, "runs": args.runs,
                    "operators": operators, "size_bytes": 6000}
        meta_path = out / "meta.json"
        if meta_path.exists():
            meta = json.loads(meta_path.read_text())
        else:
            from run import machine_facts

            class _Settings:
                def as_dict(self) -> dict[str, Any]:
                    return {}

            meta = machine_facts(cp, _Settings())  # type: ignore[arg-type]
            meta["wall_seconds"] = round(time.monotonic() - began)
        meta.setdefault("settings", {})["admission"] = settings
        meta_path.write_text(json.dumps(meta, indent=2))
    write_rows(out, rows)
    progress(f"wrote {out / 'h.csv'}; summary: python bench/report.py {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
