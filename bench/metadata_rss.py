"""Resident memory per cached object: ConfigMaps of ~6 KB cached whole vs as metadata only.

    python bench/metadata_rss.py                 # N = 2000 (the reduced size), 3 runs per mode
    python bench/metadata_rss.py --n 10000 --runs 5

Starts a local control plane (declop.testing.ControlPlane), creates N ConfigMaps in one
namespace, each with a ~6,000-byte ``data`` payload (the benchmark's object: bench/run.py) and
a few labels and annotations, then, for each mode and run, starts a fresh Python process that
first syncs the same kind of informer on an empty namespace (so one-off costs are in the
baseline), then builds one informer (``metadata_only`` False or True) on the N objects, lets it
sync, collects garbage and reports ``(RSS after - RSS before) / N``; one more run per mode measures the Python heap growth with
``tracemalloc`` instead (what the objects themselves take, without allocator slack). One process per measurement: nothing is shared between modes.
Prints a Markdown table; ``--json`` writes the raw numbers too.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

PAYLOAD = 6000


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def child(kubeconfig: str, namespace: str, metadata_only: bool, n: int, trace: bool) -> dict[str, Any]:
    from declop.kube.discovery import ResourceInfo
    from declop.cache.informer import Informer
    from declop.kube.transport import Transport, load_configuration

    configmaps = ResourceInfo(group="", version="v1", plural="configmaps", kind="ConfigMap", namespaced=True)
    transport = Transport(load_configuration(kubeconfig))
    # warm-up: the same code paths on an empty namespace, so that one-off costs (connections,
    # TLS, lazily built code paths, the first watch) are in the baseline, not divided among objects
    warm = Informer(transport, configmaps, namespace=namespace + "-empty", metadata_only=metadata_only, list_mode="paged")
    warm.start()
    await warm.synced.wait()
    await warm.stop()
    del warm
    gc.collect()
    if trace:
        tracemalloc.start()
    before = rss_bytes()
    informer = Informer(transport, configmaps, namespace=namespace, metadata_only=metadata_only, list_mode="paged")
    started = time.monotonic()
    informer.start()
    await informer.synced.wait()
    took = time.monotonic() - started
    gc.collect()
    after = rss_bytes()
    traced = tracemalloc.get_traced_memory()[0] if trace else 0
    tracemalloc.stop()
    objects = len(informer.store)
    sample = next(iter(informer.store))
    await informer.stop()
    await transport.close()
    assert objects >= n, f"{objects} cached, expected {n}"
    return {
        "mode": "metadata_only" if metadata_only else "whole",
        "objects": objects,
        "rss_delta": after - before,
        "per_object": (after - before) / objects,
        "traced": trace,
        "traced_per_object": traced / objects,
        "sync_seconds": took,
        "cached_json_bytes": len(json.dumps(sample)),
    }


def populate(api: Any, namespace: str, n: int) -> None:
    import kubernetes.client

    core = kubernetes.client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": namespace}})
    core.create_namespace({"metadata": {"name": namespace + "-empty"}})
    for i in range(n):
        body = {
            "metadata": {
                "name": f"cm-{i:06d}",
                "labels": {"app": "bench", "tier": "cache", "index": str(i % 97)},
                "annotations": {"bench/seq": str(i), "example.com/owner": "team-a"},
            },
            "data": {"payload": ("x" * 59 + "\n") * (PAYLOAD // 60)},
        }
        core.create_namespaced_config_map(namespace, body)
        if i % 500 == 499:
            print(f"  created {i + 1}/{n}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="ConfigMaps to cache (default 2000)")
    parser.add_argument("--runs", type=int, default=3, help="measurements per mode (default 3)")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw numbers here")
    parser.add_argument("--child", choices=["whole", "metadata_only"], help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--namespace", default="bench-rss", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(child(args.kubeconfig, args.namespace, args.child == "metadata_only", args.n, args.trace))))
        return

    from declop.testing import ControlPlane

    with ControlPlane(controller_manager=False) as cp:
        with cp.api_client() as api:
            print(f"creating {args.n} ConfigMaps of ~{PAYLOAD} B…", file=sys.stderr)
            populate(api, args.namespace, args.n)
        results: list[dict[str, Any]] = []
        for run in range(args.runs + 1):  # the last run is traced (tracemalloc inflates RSS: not counted there)
            trace = run == args.runs
            for mode in ("whole", "metadata_only"):
                out = subprocess.run(
                    [sys.executable, __file__, "--child", mode, "--kubeconfig", cp.kubeconfig_path,
                     "--namespace", args.namespace, "--n", str(args.n), *(["--trace"] if trace else [])],
                    capture_output=True, text=True, check=True,
                )
                results.append(json.loads(out.stdout))
                what = "Python heap" if trace else "RSS"
                value = results[-1]["traced_per_object" if trace else "per_object"]
                print(f"  run {run + 1} {mode}: {what} {value:.0f} B/object", file=sys.stderr)
    print(f"\nRSS per cached object, {args.n} ConfigMaps of ~{PAYLOAD} B, median of {args.runs} (min–max):\n")
    print("| cache | RSS per object | Python heap per object (tracemalloc) | cached object as JSON | sync |")
    print("|---|---|---|---|---|")
    for mode in ("whole", "metadata_only"):
        rows = [r for r in results if r["mode"] == mode and not r["traced"]]
        (traced,) = [r for r in results if r["mode"] == mode and r["traced"]]
        per = [r["per_object"] for r in rows]
        sync = statistics.median(r["sync_seconds"] for r in rows)
        print(
            f"| {mode.replace('_', ' ')} | {statistics.median(per):,.0f} B ({min(per):,.0f}–{max(per):,.0f}) "
            f"| {traced['traced_per_object']:,.0f} B "
            f"| {rows[0]['cached_json_bytes']:,} B | {sync:.2f} s |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
