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

``--base <commit>`` instead of ``--before``: that commit (``git archive``) against this working
tree, which is what ``make bench-pairs BASE=<commit>`` runs. ``--micro`` adds, and
``--micro-only`` runs only, the in-process hot-path pairs (no apiserver, seconds each): each
tree's own ``bench/controller_cost.py`` (µs per key, one at a time and backlog) and
``bench/event_cost.py --one`` (µs of CPU per update, p99 event → handler), alternating which tree
goes first, medians and after ÷ before.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import statistics
import subprocess
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
    churned = list(csv.DictReader(open(out / "b.csv"))) if (out / "b.csv").exists() else []  # none without the churn size
    for row in churned:
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


def micro(trees: dict[str, Path], runs: int) -> str:
    """In-process hot-path pairs: each tree's own controller_cost.py and event_cost.py --one."""
    figures: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
    for r in range(runs):
        for name in (list(trees) if r % 2 == 0 else list(reversed(trees))):
            tree = trees[name]
            env = {**os.environ, "PYTHONPATH": str(tree)}
            line = subprocess.run([sys.executable, str(tree / "bench" / "controller_cost.py")], env=env, cwd=tree,
                                  capture_output=True, text=True, check=True).stdout
            m = re.search(r"one at a time ([\d.]+) µs/key\s+backlog ([\d.]+) µs/key", line)
            assert m, line
            one = json.loads(subprocess.run(
                [sys.executable, str(tree / "bench" / "event_cost.py"), "--one", "--events", "3000", "--reps", "5", "--seconds", "3"],
                env=env, cwd=tree, capture_output=True, text=True, check=True).stdout)
            got = {"controller µs/key, one at a time": float(m.group(1)), "controller µs/key, backlog": float(m.group(2)),
                   "event CPU µs/update": one["cpu_us_per_update"], "event p99 ms": one["p99_ms"]}
            for k, v in got.items():
                figures[name].setdefault(k, []).append(v)
            progress(f"micro {r + 1}/{runs} {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in got.items()))
    before, after = list(trees)
    lines = []
    for k in figures[before]:
        b, a = statistics.median(figures[before][k]), statistics.median(figures[after][k])
        lines.append(f"{k:<34} before {b:9.2f}   after {a:9.2f}   after/before {a / b:.3f}   "
                     f"(runs before {', '.join(f'{x:.1f}' for x in figures[before][k])}; after {', '.join(f'{x:.1f}' for x in figures[after][k])})")
    return "\n".join(lines)


def base_tree(commit: str) -> Path:
    """``commit`` of this repository, unpacked (git archive) under bench/.work/."""
    repo = lib.BENCH.parent
    sha = subprocess.run(["git", "rev-parse", "--short", commit], cwd=repo, capture_output=True, text=True).stdout.strip()
    if not sha:
        raise SystemExit(f"bench-pairs: {commit!r} is not a commit of {repo}; give BASE=<commit> (e.g. BASE=main~3)")
    tree = lib.BENCH / ".work" / f"base-{sha}"
    if not (tree / "declop").is_dir():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", sha], cwd=repo, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="a tree with declop/ (the baseline)")
    ap.add_argument("--base", help="a commit of this repository as the baseline, instead of --before")
    ap.add_argument("--after", type=Path, default=lib.BENCH.parent, help="a tree with declop/ (default: this one)")
    ap.add_argument("--micro", action="store_true", help="also the in-process hot-path pairs")
    ap.add_argument("--micro-only", action="store_true", help="only the in-process hot-path pairs (no apiserver)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--n", type=int, action="append", help="cold-start sizes (default 10000 and 1000)")
    ap.add_argument("--rate", type=float, action="append", help="churn rates at N=1000 (default 1000)")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    if (args.before is None) == (args.base is None):
        ap.error("give the baseline as --before <tree> or --base <commit>")
    before = args.before if args.before is not None else base_tree(args.base)
    args.out.mkdir(parents=True, exist_ok=True)
    trees = {"declop-before": before.resolve(), "declop-after": args.after.resolve()}
    texts, failures = [], []
    if args.micro or args.micro_only:
        texts.append(micro(trees, args.runs))
    if not args.micro_only:
        failures = measure(trees, args.runs, args.n or [10000, 1000], args.rate or [1000.0], args.out)
        texts.append(summary(args.out))
    text = "\n".join(texts)
    (args.out / "pairs.txt").write_text(text + "\n")
    print(text)
    if failures:
        print("failures:", *failures, sep="\n  ")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
