"""Operator CPU per update under steady churn, for declop's handler kinds beside controller-runtime.

    python bench/churn_cpu.py --rate 100 --runs 6 --base <commit> --out bench/results/<date>-churn-cpu

One control plane; each run, every variant in turn (the order rotates by one per run, so drift
falls on all alike) gets its own namespace of 1,000 ConfigMaps of ~6 KB, starts, reconciles them
all, rests 2 s, then the load generator updates them at ``--rate`` for 10 s; the figure is the
operator process's CPU (utime + stime, every thread) over that window and the drain after it,
divided by the updates that succeeded. Variants:

- ``declop``: the no-op reconciler of ``bench/ops/declop_noop.py`` as a plain ``def`` (runs in a
  handler thread: one thread hop per reconcile at a steady rate, nothing to batch);
- ``declop-async``: the same handler as ``async def`` (runs on the event loop: no hop);
- ``base`` (with ``--base``): ``declop`` from that commit (``git archive``, as ``bench/pairs.py``);
- ``controller-runtime``: ``bench/baseline-go``.

Prints each run and the medians with their ratio to controller-runtime; writes ``runs.csv`` and
``summary.md`` to ``--out``. No number is typed by hand.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lib  # noqa: E402
from lib import (  # noqa: E402
    CONFIGMAPS, GO_BASELINE, LOADGEN, OPERATOR_GROUP, OPERATORS, BenchControlPlane, LoadGen, OperatorProcess, go_build,
    progress, wait_until,
)
from pairs import base_tree  # noqa: E402

OBJECTS = 1000
SECONDS = 10.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=100.0, help="updates per second (default 100)")
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--base", help="also declop from this commit")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    here = lib.REPO
    variants: dict[str, tuple[str, Path, dict[str, str]]] = {
        "declop": ("declop", here, {}),
        "declop-async": ("declop", here, {"BENCH_DECLOP_ASYNC": "1"}),
        "controller-runtime": ("controller-runtime", here, {}),
    }
    if args.base:
        variants = {"base": ("declop", base_tree(args.base), {}), **variants}
    go_build(GO_BASELINE, "baseline")
    go_build(LOADGEN, "loadgen")
    args.out.mkdir(parents=True, exist_ok=True)
    work = lib.BENCH / ".work"
    work.mkdir(exist_ok=True)
    per: dict[str, list[float]] = {name: [] for name in variants}
    rows = []
    with BenchControlPlane(controller_manager=False) as cp:
        users = {name: cp.add_user(f"bench-{name}", groups=["system:masters", OPERATOR_GROUP]) for name in variants}
        gen = LoadGen(cp, cp.add_user("bench-loadgen", groups=["system:masters"]), CONFIGMAPS, 6000)
        for run in range(args.runs):
            names = list(variants)
            names = names[run % len(names):] + names[: run % len(names)]
            for name in names:
                spec, tree, env = variants[name]
                lib.REPO = tree  # the operator's working directory: its declop/ is imported
                ns = f"churn-{name}-{run + 1}"
                cp.json("POST", "/api/v1/namespaces", {"metadata": {"name": ns}}, ok=(201, 409))
                gen.create(ns, "obj-", OBJECTS)
                op = OperatorProcess(OPERATORS[spec], ns, users[name], work / ns, CONFIGMAPS, extra_env=env)
                try:
                    def synced() -> bool:
                        op.log.poll()
                        return len({key for _, key, _ in op.log.since(0)}) >= OBJECTS

                    wait_until(synced, 120)
                    time.sleep(2.0)
                    t0, cpu0 = time.monotonic(), op.cpu_seconds()
                    writes = gen.churn(ns, "obj-", OBJECTS, args.rate, SECONDS, 10_000_000)
                    time.sleep(0.5)
                    cpu = op.cpu_seconds() - cpu0
                    wall = time.monotonic() - t0
                finally:
                    op.stop()
                    lib.REPO = here
                ok = sum(1 for w in writes if w.status == 200)
                us = cpu / ok * 1e6 if ok else float("nan")
                per[name].append(us)
                rows.append({"run": run + 1, "variant": name, "updates_ok": ok, "seconds": round(wall, 3),
                             "cpu_seconds": round(cpu, 4), "cpu_us_per_update": round(us, 1)})
                progress(f"run {run + 1}/{args.runs} {name:<20} {ok / SECONDS:6.0f} updates/s ok   {us:6.0f} µs CPU per update")
                cp.request("DELETE", f"/api/v1/namespaces/{ns}")
    with open(args.out / "runs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    cr = statistics.median(per["controller-runtime"])
    lines = [
        f"# Operator CPU per update at {args.rate:g} updates/s over {OBJECTS} ConfigMaps ({args.runs} runs, interleaved)",
        "",
        f"`python bench/churn_cpu.py --rate {args.rate:g} --runs {args.runs}" + (f" --base {args.base}" if args.base else "") + "`",
        "",
        "| variant | median µs CPU per update | ÷ controller-runtime | runs |",
        "|---|---|---|---|",
    ]
    for name, values in per.items():
        m = statistics.median(values)
        lines.append(f"| {name} | {m:.0f} | {m / cr:.2f}× | {', '.join(f'{v:.0f}' for v in values)} |")
    text = "\n".join(lines) + "\n"
    (args.out / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
