"""Start-up: what a user waits for on every restart and every ``declop dev`` reload (issue 24).

    python bench/startup.py --runs 15 --out bench/results/<date>-startup
    python bench/startup.py --runs 15 --base <commit> --out ...   # that commit's declop beside this tree's

One control plane, one namespace holding one ConfigMap. Each round, interleaved so drift hits
every row alike, measures the wall time of:

- a ladder of imports, each a fresh ``python -c`` on the interpreter declop runs on, from exec to
  the imports done (its teardown not counted): nothing,
  ``asyncio`` + ``ssl``, ``aiohttp`` (declop's HTTP client; its import builds two default TLS
  contexts, each parsing the system trust store), ``aiohttp`` as declop imports it (those two
  reads deferred to first use, ``declop/kube/truststore.py``), then everything ``declop run`` imports
  (``declop``, ``declop.cli``, ``declop.manager``) — the floor under any Python operator on
  aiohttp, and declop's own share above it;
- process start → first reconcile of the ConfigMap, for ``declop run`` (streaming list, the
  default), ``declop run`` with paged lists, and the controller-runtime baseline
  (``bench/baseline-go``), each with the no-op reconciler of ``bench/ops`` and a JSON
  kubeconfig: the main table's f(0).

With ``--base`` the declop rows run for both trees (``git archive`` of the commit, as
``bench/pairs.py``), the base first in odd rounds. Prints a Markdown table (median and min of the
rounds) and writes it with the raw rows to ``--out``. No number is typed by hand.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib import GO_BASELINE, REPO, BenchControlPlane, ReconcileLog, go_build, progress  # noqa: E402
from pairs import base_tree  # noqa: E402

LADDER = [
    ("python: nothing", "pass"),
    ("+ asyncio, ssl", "import asyncio, ssl"),
    ("+ aiohttp (declop's HTTP client)", "import asyncio, ssl, aiohttp"),
    # the same import as declop makes it since kube/truststore.py: the two default contexts'
    # trust-store reads deferred to their first use (the file loaded alone, not the package)
    ("+ aiohttp, trust store read on first use (as declop imports it)",
     "import asyncio, ssl, importlib.util as u\n"
     "s = u.spec_from_file_location('truststore', 'declop/kube/truststore.py')\n"
     "m = u.module_from_spec(s); s.loader.exec_module(m); m.import_aiohttp()"),
]
RUN_IMPORTS = ("everything `declop run` imports", "import declop, declop.cli, declop.manager")


def imported(stmt: str, cwd: Path, env: dict[str, str]) -> float:
    """Process start → ``stmt`` done, in a fresh interpreter (its teardown not counted)."""
    code = f"{stmt}\nimport os, time\nprint(time.time_ns(), flush=True)\nos._exit(0)"
    t_exec = time.time_ns()
    out = subprocess.run([sys.executable, "-c", code], check=True, cwd=str(cwd), env=env, capture_output=True, text=True).stdout
    return (int(out.split()[-1]) - t_exec) / 1e9


def first_reconcile(argv: list[str], cwd: Path, env: dict[str, str], out: Path) -> float:
    """Process start → the first line of its reconcile log (``<t_ns> <ns>/<name> <seq>``)."""
    out.unlink(missing_ok=True)
    log = ReconcileLog(out)
    t_exec = time.time_ns()
    errors = out.with_suffix(".stderr")
    with open(errors, "wb") as err:  # a file, not a pipe: an operator's log lines never block it
        proc = subprocess.Popen(argv, cwd=str(cwd), env={**env, "BENCH_OUT": str(out)}, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            log.poll()
            if log.lines:
                return (log.lines[0][0] - t_exec) / 1e9
            if proc.poll() is not None:
                raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {errors.read_text(errors='replace')[-2000:]}")
            time.sleep(0.002)
        raise RuntimeError(f"{' '.join(argv)}: no reconcile within 60 s")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
        proc.wait(15)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--base", help="a commit of this repository whose declop rows run beside this tree's")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    go_build(GO_BASELINE, "baseline")
    trees = {"this tree": REPO}
    if args.base:
        trees = {f"base {args.base}": base_tree(args.base), **trees}
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="declop-startup-") as tmp, BenchControlPlane(controller_manager=False) as cp:
        work = Path(tmp)
        kubeconfig = cp.add_user("bench-startup", groups=["system:masters"])
        ns = "startup"
        cp.json("POST", "/api/v1/namespaces", {"metadata": {"name": ns}}, ok=(201, 409))
        cp.json("POST", f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "probe"}, "data": {"a": "b"}}, ok=(201, 409))
        # Bytecode caches as an installed declop has them (pip compiles at install): written on
        # first import ("0" means write; a machine may export PYTHONDONTWRITEBYTECODE=1) and
        # compiled up front, or a tree fresh from `git archive` would compile every module on
        # every start (~0.1 s) and its rows would measure the compiler.
        base_env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
        base_env["PYTHONDONTWRITEBYTECODE"] = "0"
        for tree in trees.values():
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "declop")], check=True)
        for run in range(1, args.runs + 1):
            progress(f"round {run}/{args.runs}")
            for what, stmt in LADDER:
                rows.append({"run": run, "what": what, "seconds": imported(stmt, REPO, base_env)})
            order = list(trees.items()) if run % 2 else list(reversed(trees.items()))
            for name, tree in order:
                env = {**base_env, "PYTHONPATH": str(tree)}  # cwd is the tree too: its declop comes first
                suffix = f" ({name})" if len(trees) > 1 else ""
                rows.append({"run": run, "what": f"+ {RUN_IMPORTS[0]}{suffix}",
                             "seconds": imported(RUN_IMPORTS[1], tree, env)})
                noop = [sys.executable, "-m", "declop", "run", str(tree / "bench" / "ops" / "declop_noop.py"),
                        "-n", ns, "--kubeconfig", kubeconfig]
                for label, extra in (("declop", {}), ("declop, paged lists", {"DECLOP_LIST_MODE": "paged"})):
                    rows.append({"run": run, "what": f"{label}{suffix}: start → first reconcile",
                                 "seconds": first_reconcile(noop, tree, {**env, **extra}, work / "out.log")})
            go = [str(GO_BASELINE / "baseline"), "--kubeconfig", kubeconfig, "--namespace", ns,
                  "--user-agent", "bench-startup", "--out", str(work / "out.log")]
            rows.append({"run": run, "what": "controller-runtime: start → first reconcile",
                         "seconds": first_reconcile(go, REPO, base_env, work / "out.log")})
    with open(args.out / "startup.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["run", "what", "seconds"])
        w.writeheader()
        w.writerows(rows)
    order_of = list(dict.fromkeys(str(r["what"]) for r in rows))
    by = {what: [float(str(r["seconds"])) for r in rows if r["what"] == what] for what in order_of}
    cr = statistics.median(by["controller-runtime: start → first reconcile"])
    base = f" --base {args.base}" if args.base else ""
    lines = [
        f"Start-up, {args.runs} interleaved rounds (`python bench/startup.py --runs {args.runs}{base}`), wall seconds;",
        "the import ladder is cumulative (each row imports what the rows above it did).",
        "",
        "| what | median | min | median ÷ controller-runtime's start |",
        "|---|---|---|---|",
    ]
    for what in order_of:
        xs = by[what]
        lines.append(f"| {what} | {statistics.median(xs):.3f} | {min(xs):.3f} | {statistics.median(xs) / cr:.2f}× |")
    text = "\n".join(lines) + "\n"
    (args.out / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
