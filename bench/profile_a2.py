"""Profile declop's cold start (a2) with cProfile: N objects exist, declop (the in-process driver,
default Options) starts, lists, reconciles each once; prints the top functions and GC pauses.

    python bench/profile_a2.py --n 10000 [--sort tottime] [--top 30]

Used to write bench/FINDINGS.md. Needs the control-plane binaries (DECLOP_ASSETS_DIR).
"""

from __future__ import annotations

import argparse
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib import (  # noqa: E402
    CONFIGMAPS, LOADGEN, OPERATOR_GROUP, OPS, BenchControlPlane, LoadGen, ReconcileLog, go_build, wait_until,
)

GC_PROBE = """
import gc, time, os
_t = {}
_out = os.open(os.environ["BENCH_GC_OUT"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
def _cb(phase, info):
    if phase == "start":
        _t["s"] = time.perf_counter()
    else:
        os.write(_out, f"{info['generation']} {(time.perf_counter() - _t['s']) * 1000:.2f} {info['collected']}\\n".encode())
gc.callbacks.append(_cb)
_exp = set(filter(None, os.environ.get("BENCH_EXPERIMENTS", "").split(",")))
if "identity" in _exp:  # no gzip for LIST responses
    import declop.kube.transport as _tr
    _h = _tr.Transport._headers
    def _headers(self, ct):
        h = _h(self, ct)
        h["Accept-Encoding"] = "identity"
        return h
    _tr.Transport._headers = _headers
if _exp & {"stacks", "samples"}:  # a 5 ms ticker on the loop; watchdog threads read how late it is
    import sys, threading, traceback, asyncio as _aio
    _main = threading.get_ident()
    _tick = [time.perf_counter()]
    def _ticker():
        _tick[0] = time.perf_counter()
        _aio.get_running_loop().call_later(0.005, _ticker)
    _orig_run = _aio.run
    def _run(main, **kw):
        async def _wrapped():
            _aio.get_running_loop().call_soon(_ticker)
            return await main
        return _orig_run(_wrapped(), **kw)
    _aio.run = _run
if "stacks" in _exp:  # the loop thread's stack, once, when a tick is 30 ms late
    def _watch():
        seen = None
        while True:
            time.sleep(0.01)
            late = time.perf_counter() - _tick[0]
            if late > 0.03 and seen != _tick[0]:
                seen = _tick[0]
                frame = sys._current_frames().get(_main)
                stack = "".join(traceback.format_stack(frame, limit=12)) if frame else "?"
                os.write(_out, f"STALL {late * 1000:.0f} ms at {time.time_ns()}\\n{stack}\\n".encode())
    threading.Thread(target=_watch, daemon=True).start()
if "samples" in _exp:  # one compact sample of the loop thread every 5 ms while a tick is >= 20 ms late
    # (no sample during a late stretch with full loop CPU: one C call held the GIL throughout)
    def _sample():
        while True:
            time.sleep(0.005)
            late = time.perf_counter() - _tick[0]
            if late >= 0.02:
                frame, parts = sys._current_frames().get(_main), []
                while frame is not None and len(parts) < 6:
                    parts.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}:{frame.f_code.co_name}")
                    frame = frame.f_back
                os.write(_out, f"SAMPLE {_tick[0]:.3f} {late * 1000:.0f} {' < '.join(parts)}\\n".encode())
    threading.Thread(target=_sample, daemon=True).start()
if "nogc-list" in _exp:  # no cyclic GC while a LIST is decoded and stored (freeze follows anyway)
    import declop.cache.listing as _listing
    _list = _listing.Sync.list
    async def _quiet_list(self):
        gc.disable()
        try:
            await _list(self)
        finally:
            gc.enable()
    _listing.Sync.list = _quiet_list
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--sort", default="tottime")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--no-profile", action="store_true", help="only GC pauses and the stall probe")
    ap.add_argument("--experiments", default="", help="';'-separated sets of comma lists: identity, nogc-list, async, stacks, samples (see GC_PROBE)")
    ap.add_argument("--repeat", type=int, default=1, help="start the operator this many times")
    args = ap.parse_args()
    go_build(LOADGEN, "loadgen")
    tmp = Path(tempfile.mkdtemp(prefix="declop-prof-"))
    with BenchControlPlane(controller_manager=False) as cp:
        gen = cp.add_user("bench-loadgen", groups=["system:masters"])
        kc = cp.add_user("bench-declop-inproc", groups=["system:masters", OPERATOR_GROUP])
        cp.json("POST", "/api/v1/namespaces", {"metadata": {"name": "prof"}})
        LoadGen(cp, gen, CONFIGMAPS, 6000).create("prof", "obj-", args.n)
        for j, exp in enumerate(args.experiments.split(";")):
            for i in range(args.repeat):
                print(f"--- experiments: {exp or 'none'} (#{i + 1})")
                run_once(args, exp, tmp / f"{j}-{i}", kc)


def run_once(args: argparse.Namespace, experiments: str, tmp: Path, kc: str) -> None:
    if True:
        tmp.mkdir(parents=True)
        (tmp / "sitecustomize.py").write_text(GC_PROBE)
        env = {**os.environ, "BENCH_OUT": str(tmp / "rec.log"), "BENCH_STALL_OUT": str(tmp / "stall.log"),
               "BENCH_GC_OUT": str(tmp / "gc.log"), "PYTHONPATH": str(tmp),
               "BENCH_EXPERIMENTS": experiments,
               "BENCH_DECLOP_ASYNC": "1" if "async" in experiments.split(",") else ""}
        prof = tmp / "a2.prof"
        argv = [sys.executable] + ([] if args.no_profile else ["-m", "cProfile", "-o", str(prof)]) + [
            str(OPS / "declop_inproc.py"), "prof", kc]
        t0 = time.time_ns()
        p = subprocess.Popen(argv, env=env, stdout=open(tmp / "op.log", "wb"), stderr=subprocess.STDOUT)
        log = ReconcileLog(tmp / "rec.log")
        ok = wait_until(lambda: log.poll() is not None and len(log.lines) >= args.n, 300)
        t_all = max(t for t, _, _ in log.lines) if log.lines else t0
        t_first = min(t for t, _, _ in log.lines) if log.lines else t0
        print(f"a2: {ok} {(t_all - t0) / 1e9:.2f} s to {len(log.lines)} reconciles, first at {(t_first - t0) / 1e9:.2f} s (profiler on: {not args.no_profile})")
        time.sleep(1)
        p.send_signal(signal.SIGTERM)
        p.wait(60)
        stalls = [line.split() for line in (tmp / "stall.log").read_text().splitlines()]
        first = round((t_first - t0) / 1e6)
        print(f"stall maxima (ms after start, lateness ms, loop thread CPU ms, process CPU ms; first reconcile at {first} ms):",
              [(round((int(r[0]) - t0) / 1e6), *map(float, r[1:])) for r in stalls][-5:])
        lines = (tmp / "gc.log").read_text().splitlines()
        gcs = [line.split() for line in lines if line[:1].isdigit()]
        stacks = [line for line in lines if not line[:1].isdigit()]
        if stacks:
            print("loop-thread stacks at stalls (experiment 'stacks'):", *stacks, sep="\n")
        big = sorted(gcs, key=lambda g: -float(g[1]))[:8]
        print(f"gc passes: {len(gcs)}; gen2: {sum(1 for g in gcs if g[0] == '2')}; longest (gen, ms, collected):", big)
        if not args.no_profile:
            pstats.Stats(str(prof)).sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    main()
