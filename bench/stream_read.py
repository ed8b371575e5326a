"""What a 10k-object initial list costs a client, by strategy, against one apiserver: the
operator's CPU and the wall time, next to curl as the apiserver's delivery floor.

N ConfigMaps (6 KB payload) exist; each round runs, in turn and each in its own process (CPU is
that process's rusage, the TLS connection made before the clock starts):

* ``stream``        declop's streaming list as the informer reads it: ``Transport.stream`` with
                    ``bulk`` until the initial-events-end bookmark, every line decoded;
* ``stream-nobulk`` the same, every read handed on at once (declop before a72ff0a);
* ``paged``         paginated LISTs of 500 (``Transport.request``, every page decoded);
* ``curl-json``     curl (HTTP/1.1) reading the same streaming list as JSON, nothing decoded:
                    the apiserver's delivery with a client that costs ~nothing;
* ``curl-protobuf`` the same as protobuf, what controller-runtime asks for built-in kinds
                    (``apiutil.createRestConfig`` sets ``application/vnd.kubernetes.protobuf``).

Prints every round and the medians. Needs the control-plane binaries (``DECLOP_ASSETS_DIR``):

    python bench/stream_read.py [--n 10000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

MODES = ("stream", "stream-nobulk", "paged", "curl-json", "curl-protobuf")
STREAM_PARAMS = {"watch": "1", "allowWatchBookmarks": "true", "resourceVersion": "", "sendInitialEvents": "true",
                 "resourceVersionMatch": "NotOlderThan", "timeoutSeconds": "120"}


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _declop(mode: str, kubeconfig: str, path: str) -> tuple[int, float, float]:
    from declop.kube.transport import Transport, load_configuration, loads

    transport = Transport(load_configuration(kubeconfig), qps=1000, burst=1000)
    await transport.request("GET", path, params={"limit": 1})  # the connection, before the clock
    cpu, wall, n = _cpu(), time.perf_counter(), 0
    if mode == "paged":
        params: dict[str, object] = {"limit": 500}
        while True:
            page = await transport.request("GET", path, params=params, lane="informer")
            n += len(page["items"])
            token = page["metadata"].get("continue")
            if not token:
                break
            params["continue"] = token
    else:
        synced = False
        bulk = (lambda: not synced) if mode == "stream" else None
        async for line in transport.stream(path, STREAM_PARAMS, bulk=bulk):
            event = loads(line)
            if event["type"] == "BOOKMARK":
                if (event["object"]["metadata"].get("annotations") or {}).get("k8s.io/initial-events-end"):
                    synced = True
                    break
                continue
            n += 1
    wall, cpu = time.perf_counter() - wall, _cpu() - cpu
    await transport.close()
    return n, wall, cpu


def _curl(mode: str, kubeconfig: str, path: str, creds: Path) -> tuple[int, float, float]:
    config = json.loads(Path(kubeconfig).read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    creds.mkdir(exist_ok=True)
    for name, data in (("ca", cluster["certificate-authority-data"]), ("crt", user["client-certificate-data"]),
                       ("key", user["client-key-data"])):
        (creds / name).write_bytes(base64.b64decode(data))
    accept = "application/vnd.kubernetes.protobuf;stream=watch" if mode == "curl-protobuf" else "application/json"
    query = "&".join(f"{k}={v}" for k, v in STREAM_PARAMS.items())
    argv = ["curl", "-sN", "--http1.1", "--cacert", str(creds / "ca"), "--cert", str(creds / "crt"),
            "--key", str(creds / "key"), "-H", f"Accept: {accept}", f"{cluster['server']}{path}?{query}"]
    wall = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, bufsize=0)
    assert proc.stdout is not None
    tail, size = b"", 0
    while chunk := os.read(proc.stdout.fileno(), 1 << 20):
        size += len(chunk)
        tail = tail[-64:] + chunk
        if b"initial-events-end" in tail:
            break
    wall = time.perf_counter() - wall
    proc.kill()
    proc.wait()
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return -size, wall, r.ru_utime + r.ru_stime  # curl counts bytes, not objects (negative)


def client(mode: str, kubeconfig: str, path: str, creds: Path) -> None:
    n, wall, cpu = _curl(mode, kubeconfig, path, creds) if mode.startswith("curl") else asyncio.run(
        _declop(mode, kubeconfig, path))
    counted = {"bytes": -n} if n < 0 else {"objects": n}
    print(json.dumps({"mode": mode, **counted, "wall": round(wall, 3), "cpu": round(cpu, 3)}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--client", nargs=3, metavar=("MODE", "KUBECONFIG", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client:
        client(*args.client, creds=Path(args.client[1]).with_suffix(".curl"))
        return
    from lib import CONFIGMAPS, LOADGEN, OPERATOR_GROUP, BenchControlPlane, LoadGen, go_build

    go_build(LOADGEN, "loadgen")
    modes = args.modes.split(",")
    results: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    with BenchControlPlane(controller_manager=False) as cp:
        gen = cp.add_user("bench-loadgen", groups=["system:masters"])
        kubeconfig = cp.add_user("bench-stream-read", groups=["system:masters", OPERATOR_GROUP])
        cp.json("POST", "/api/v1/namespaces", {"metadata": {"name": "read"}})
        LoadGen(cp, gen, CONFIGMAPS, 6000).create("read", "obj-", args.n)
        path = "/api/v1/namespaces/read/configmaps"
        for r in range(args.rounds):
            for mode in modes[r % len(modes):] + modes[:r % len(modes)]:  # rotate who goes first
                out = subprocess.run([sys.executable, __file__, "--client", mode, kubeconfig, path],
                                     capture_output=True, text=True, check=True).stdout
                row = json.loads(out.strip().splitlines()[-1])
                if row.get("objects", args.n) == args.n:
                    results[mode].append((row["wall"], row["cpu"]))
                print(f"round {r + 1}: {row}", flush=True)
    print(f"\nmedians over {args.rounds} rounds, {args.n} objects (client CPU: the reading process's)")
    print(f"{'mode':<15} {'wall s':>8} {'client CPU s':>13}")
    for mode, rows in results.items():
        if rows:
            print(f"{mode:<15} {statistics.median(w for w, _ in rows):>8.3f} {statistics.median(c for _, c in rows):>13.3f}")


if __name__ == "__main__":
    main()
