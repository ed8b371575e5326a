"""`declop sim examples/kopf/15_timers.py --seed 16 --mode sharded` with the `unsynced` fault: a
replica restarted with every list refused took ranges and never listed them, so objects created
in them were never reconciled (I3). Its sharded informers owned no range at start and called
themselves synced at once; range Leases are gated on sync. Now such an informer is synced only
once a LIST of one object succeeded (declop.cache.listing.may_list; docs/leases.md). The
built-in world never showed it: its controller also watches ConfigMaps unsharded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
FAULTS = "hang,fail,cut,slow,pause,crash,compact,pause-at-write,term,delete,stuck,term-in-call,hang-leases,wall-jump,rollout,partition-holder,pause-holder,errors,unsynced,clocks"


def test_a_replica_whose_lists_are_refused_takes_no_range() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "declop", "sim", "examples/kopf/15_timers.py", "--seed", "16", "--mode", "sharded",
         "--faults", FAULTS, "--only", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "unsynced r0: restarted with caches that never sync" in out.stdout, out.stdout[:800]
