"""Where b's end-to-end latency goes at high churn: the apiserver's delivery or declop's pipeline.

    python bench/delivery_split.py --rate 1000 --rounds 2 \
        --operators declop-inproc,declop-inproc:nice,declop-inproc:buf,declop-inproc:async,controller-runtime

One control plane; for each round and operator in turn (interleaved): a fresh namespace with 1,000
ConfigMaps of ~6 KB, the operator started and synced, then the load generator's paced merge patches
at ``--rate`` for 15 s. Per operator: achieved rate, CPU, end-to-end latency (update sent → the
reconcile that read it) and the write's own ack time. For the declop probe (bench/ops/declop_inproc.py,
real watch) also: update sent → its watch event received (``declop.cache.watch.loads`` called on
it), and received → reconcile. Variants of the probe (after a colon) test what could slow the
delivery on declop's side: ``nice`` (the process at nice -5: more CPU share on the saturated 2 cores),
``buf`` (aiohttp's read buffer 1 MiB instead of 64 KiB: no TCP back-pressure from a full buffer),
``async`` (the handler as ``async def``: no GIL hand-over with a handler thread).
Prints one block per lifecycle; nothing is written but stdout.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lib import (  # noqa: E402
    CONFIGMAPS, LOADGEN, OPERATOR_GROUP, OPERATORS, BenchControlPlane, LoadGen, OperatorProcess, go_build,
    pair_latencies, wait_until,
)

#: imported by the ``buf`` variant's interpreter (PYTHONPATH): a larger read buffer for every aiohttp session
READBUF = """import os
if os.environ.get("BENCH_READBUF"):
    import aiohttp
    _init = aiohttp.ClientSession.__init__
    def __init__(self, *a, **kw):
        kw.setdefault("read_bufsize", int(os.environ["BENCH_READBUF"]))
        _init(self, *a, **kw)
    aiohttp.ClientSession.__init__ = __init__
"""


def pct(xs: list[int]) -> str:
    xs = sorted(xs)
    if not xs:
        return "-"
    return (f"p50 {xs[len(xs) // 2] / 1e6:7.1f} p90 {xs[int(len(xs) * .9)] / 1e6:7.1f} "
            f"p99 {xs[int(len(xs) * .99)] / 1e6:7.1f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--operators", default="declop-inproc,controller-runtime,declop")
    args = ap.parse_args()
    ops = args.operators.split(",")
    work = Path(tempfile.mkdtemp(prefix="declop-bench-split-"))
    (work / "sitecustomize.py").write_text(READBUF)
    if any(o.startswith("controller-runtime") for o in ops):
        from lib import GO_BASELINE
        go_build(GO_BASELINE, "baseline")
    go_build(LOADGEN, "loadgen")
    with BenchControlPlane(controller_manager=False) as cp:
        users = {o: cp.add_user(f"bench-{o.replace(':', '-')}", groups=["system:masters", OPERATOR_GROUP]) for o in ops}
        gen = LoadGen(cp, cp.add_user("bench-loadgen", groups=["system:masters"]), CONFIGMAPS, 6000)
        for r in range(args.rounds):
            for name in ops:
                base, _, variant = name.partition(":")
                spec = OPERATORS[base]
                env = {"buf": {"BENCH_READBUF": str(1 << 20), "PYTHONPATH": str(work)},
                       "async": {"BENCH_DECLOP_ASYNC": "1"}}.get(variant, {})
                ns = f"split-{name.replace(':', '-')}-{r}"
                cp.json("POST", "/api/v1/namespaces", {"metadata": {"name": ns}}, ok=(201,))
                gen.create(ns, "obj-", 1000)
                op = OperatorProcess(spec, ns, users[name], work / ns, CONFIGMAPS, env)
                if variant == "nice":
                    os.setpriority(os.PRIO_PROCESS, op.pid, -5)
                wait_until(lambda: (op.log.poll(), len({k for _, k, _ in op.log.lines}) >= 1000)[1], 60)
                time.sleep(1)
                t0, c0 = time.time_ns(), op.cpu_seconds()
                writes = gen.churn(ns, "obj-", 1000, args.rate, args.seconds, 10_000_000)
                time.sleep(5)
                c1, t1 = op.cpu_seconds(), time.time_ns()
                op.stop()
                ok = [w for w in writes if w.status == 200]
                recs = op.log.since(t0)
                rows, _ = pair_latencies([(f"{ns}/{w.name}", w.seq, w.send) for w in ok], recs)
                achieved = len(ok) / ((max(w.send for w in ok) - min(w.send for w in ok)) / 1e9)
                print(f"r{r} {name:20s} achieved {achieved:6.0f}/s cpu {(c1 - c0) / ((t1 - t0) / 1e9):.3f} "
                      f"e2e {pct([x[3] for x in rows if x[3] is not None])}", flush=True)
                print(f"    write ack      {pct([w.ack - w.send for w in ok])}", flush=True)
                if spec.kind == "declop-inproc":
                    first = op.first_received()
                    sent = [(f"{ns}/{w.name}", w.seq, w.send) for w in ok]
                    got = [(k, seq, first[(k, seq)]) for k, seq, _ in sent if (k, seq) in first]
                    print(f"    sent->received {pct([first[(k, seq)] - t for k, seq, t in sent if (k, seq) in first])}"
                          f" (n={len(got)})", flush=True)
                    rows2, _ = pair_latencies(got, recs)
                    print(f"    received->reconcile {pct([x[3] for x in rows2 if x[3] is not None])}", flush=True)
                cp.request("DELETE", CONFIGMAPS.collection(ns), timeout=300)
    return 0


if __name__ == "__main__":
    sys.exit(main())
