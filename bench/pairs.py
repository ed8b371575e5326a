"""Before/after pairs of declop's own variant: a2 (cold start) and b (CPU under churn), interleaved.

Two trees of declop (e.g. ``git archive main | tar -x -C /tmp/before``) run in turn against one
control plane, alternating which goes first in each run, so that the machine's drift (other
processes, thermal state) falls on both sides alike. Each lifecycle is the harness's own
(``run.Bench.lifecycle_cold``): N objects exist, the operator starts, a2 is "process start → all
reconciled once"; at the churn size it also idles, churns at each rate and runs the dedup
scenario. An operator runs ``python -m declop`` with its tree as the working directory, so the
tree's ``declop/`` is the one imported. Prints the per-run figures and the medians:

    python bench/pairs.py --before /tmp/before --after /tmp/after --runs 5 --out /tmp/pairs

Results (a2.csv, b.csv, … as run.py writes them) go to ``--out``; operators are named
``declop-before`` and ``declop-after``.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lib  # noqa: E402
import run  # noqa: E402
from lib import CONFIGMAPS, LOADGEN, OPERATOR_GROUP, AuditLog, BenchControlPlane, LoadGen, OperatorSpec, go_build, progress  # noqa: E402


def measure(trees: dict[str, Path], runs: int, sizes: list[int], rates: list[float], out: Path) -> list[str]:
    settings = run.Settings(
        quick=False, runs=runs, a1_sizes=[], cold_sizes=sizes, churn_objects=1000, rates=rates,
        churn_seconds=15.0, idle_seconds=5.0, stall_sizes=[], size_bytes=6000, block_ms=2000, burst=100,
        operators=list(trees), resource="configmaps", drain_seconds=45.0, settle_seconds=3.0,
    )
    specs = {name: OperatorSpec(name, name, "declop") for name in trees}
    go_build(LOADGEN, "loadgen")
    work = lib.BENCH / ".work"
    work.mkdir(exist_ok=True)
    with BenchControlPlane(controller_manager=False) as cp:
        kubeconfigs = {n: cp.add_user(f"bench-{n}", groups=["system:masters", OPERATOR_GROUP]) for n in trees}
        gen = cp.add_user("bench-loadgen", groups=["system:masters"])
        bench = run.Bench(settings, cp, CONFIGMAPS, LoadGen(cp, gen, CONFIGMAPS, settings.size_bytes),
                          AuditLog(cp.audit_log_path), kubeconfigs, run.CsvSink(out), out, work)
        for r in range(1, runs + 1):
            order = list(trees) if r % 2 else list(reversed(trees))
            for n in sizes:
                for name in order:
                    lib.REPO = trees[name]  # the operator's working directory: its declop/ is imported
                    progress(f"run {r}/{runs} · N={n} · {name} ({trees[name]})")
                    run._guard(bench, specs[name], lambda: bench.lifecycle_cold(specs[name], r, n))
        return bench.failures


def summary(out: Path) -> str:
    lines = []
    a2: dict[tuple[str, int], list[tuple[int, float]]] = {}
    for row in csv.DictReader(open(out / "a2.csv")):
        a2.setdefault((row["operator"], int(row["n"])), []).append((int(row["run"]), float(row["start_to_all_reconciled_s"])))
    for (op, n), values in sorted(a2.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        xs = [v for _, v in sorted(values)]
        lines.append(f"a2 N={n:<6} {op:<14} median {statistics.median(xs):.3f} s   runs {', '.join(f'{x:.3f}' for x in xs)}")
    b: dict[tuple[str, str], list[tuple[int, float, float]]] = {}
    for row in csv.DictReader(open(out / "b.csv")):
        if row["latency"] == "e2e":
            per_k = float(row["cpu_cores"]) / float(row["achieved_rate"]) * 1000
            b.setdefault((row["operator"], row["rate"]), []).append((int(row["run"]), per_k, float(row["achieved_rate"])))
    for (op, rate), values in sorted(b.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        values.sort()
        lines.append(
            f"b {rate}/s cores per 1k updates/s {op:<14} median {statistics.median(v[1] for v in values):.4f}   "
            f"runs {', '.join(f'{v[1]:.4f}' for v in values)}   achieved {', '.join(f'{v[2]:.0f}' for v in values)}/s"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, type=Path, help="a tree with declop/ (the baseline)")
    ap.add_argument("--after", required=True, type=Path, help="a tree with declop/ (the change)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--n", type=int, action="append", help="cold-start sizes (default 10000 and 1000)")
    ap.add_argument("--rate", type=float, action="append", help="churn rates at N=1000 (default 1000)")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    trees = {"declop-before": args.before.resolve(), "declop-after": args.after.resolve()}
    failures = measure(trees, args.runs, args.n or [10000, 1000], args.rate or [1000.0], args.out)
    text = summary(args.out)
    (args.out / "pairs.txt").write_text(text + "\n")
    print(text)
    if failures:
        print("failures:", *failures, sep="\n  ")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
