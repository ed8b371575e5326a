"""``declop sim examples/finalizer.py`` (a ``labels=`` controller with a finalizer): seeds that
found an object left with our finalizer after it left the filter, its later delete waiting for
ever (I4: "still being deleted"). Each pins one way the leave can reach the controller: the
filtered watch's DELETED (no fault at all), a restart that listed after the leave (the scan after
sync) and a range gained after the leave (the scan after each gain). docs/contract.md §4."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[4]

SEEDS = {
    "the filtered watch's DELETED": ("--seed", "0", "--only", "none"),
    "a restart that listed after the leave": ("--seed", "99", "--only", "1,2"),
    "a range gained after the leave": (
        "--seed", "101", "--mode", "sharded", "--fault", "12.743:compact:0:0", "--fault", "26.713:hang:0:2.043",
        "--fault", "30.211:crash:2:6.943",
    ),
}


@pytest.mark.parametrize("args", list(SEEDS.values()), ids=list(SEEDS))
def test_an_object_that_left_the_filter_can_still_be_deleted(args: tuple[str, ...]) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "declop", "sim", "examples/finalizer.py", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert out.stdout.startswith("ok declop sim examples/finalizer.py"), out.stdout[:500]


@pytest.mark.parametrize("mode", ["leader", "sharded"])
def test_random_schedules_of_the_example_keep_every_invariant(mode: str) -> None:
    """The search, not only the pins: 60 fault schedules of each mode (300 leader and 400 sharded
    seeds passed when the fix landed)."""
    out = subprocess.run(
        [sys.executable, "-m", "declop", "sim", "examples/finalizer.py", "--mode", mode, "--seeds", "60", "--start", "1000"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "60 seeds, 0 failed" in out.stdout, out.stdout[-2000:]
