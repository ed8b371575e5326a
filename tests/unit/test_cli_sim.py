"""declop sim as a user runs it (a process): one failing seed's report — its object's history,
its shrunk schedule and the line that reproduces it —, -v's log lines, and --allow."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent
SMALL = ("--objects", "30", "--duration", "20")


def sim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "declop", "sim", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_one_failing_seed_prints_its_objects_history_and_its_shrunk_schedule_which_reproduces_it() -> None:
    out = sim("examples/buggy/idempotence.py", "--seed", "0", *SMALL)
    assert out.returncode == 1, out.stdout + out.stderr
    text = out.stdout
    assert re.search(r"^the history of ns-\w+/w\d+ \(", text, re.M), text
    assert re.search(r"^ +[\d.]+  r\d#\d +make_child +call \(\w+, rv \d+, the idempotence check's one more\)$", text, re.M), text
    shrunk = text.split("\nshrunk (", 1)[1].splitlines()
    assert shrunk[0] == "1 run(s)): idempotence fails without any fault:", shrunk
    line = shrunk[1].strip()
    assert line == "declop sim examples/buggy/idempotence.py --seed 0 --objects 30 --duration 20 --only none"
    again = sim(*line.split()[2:])
    assert again.returncode == 1 and again.stdout.startswith(f"FAIL {line}\nfaults:\n  (none)\n"), again.stdout
    assert " idempotence -: one more reconcile of " in again.stdout


def test_verbose_replays_the_seed_with_declops_log_lines_at_their_virtual_time_and_replica() -> None:
    out = sim("examples/buggy/idempotence.py", "--seed", "0", *SMALL, "-v")
    assert out.returncode == 1, out.stdout + out.stderr
    logs = [line for line in out.stdout.splitlines() if line.startswith(("DEBUG t=", "INFO t=", "ERROR t=", "WARNING t="))]
    assert any(re.match(r"INFO t=[\d.]+ r\d Successfully acquired lease", line) for line in logs), out.stdout[:2000]
    assert any(re.match(r'DEBUG t=[\d.]+ r\d Reconciling \{"controller": "make_child"', line) for line in logs), out.stdout[:2000]
    report = out.stdout[out.stdout.index("FAIL declop sim"):]  # then the report, as without -v
    assert "first violation:" in report and "the history of " in report and "\nshrunk (" in report
    assert not re.search(r"^(DEBUG|INFO|WARNING|ERROR) ", report, re.M)  # the shrinking's runs (after the report) are silent


def test_allow_silences_a_property_counts_it_and_keeps_it_in_the_repro_line() -> None:
    out = sim("examples/buggy/idempotence.py", "--seeds", "2", *SMALL, "--allow", "idempotence:make_child")
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"^2 seeds, 0 failed, .*schedules/s; allowed on purpose: idempotence:make_child in 2 seed\(s\)$", out.stdout, re.M)
    one = sim("examples/buggy/idempotence.py", "--seed", "0", *SMALL, "--allow", "idempotence")
    assert one.returncode == 0 and one.stdout.startswith("ok declop sim examples/buggy/idempotence.py --seed 0 --objects 30 --duration 20 --allow idempotence\n")
    assert "allowed on purpose (--allow idempotence), not failing the seed:\n  t=" in one.stdout


def test_bad_allow_and_fault_options_are_one_line() -> None:
    bad = sim("examples/buggy/idempotence.py", "--seed", "0", "--allow", "I1")
    assert bad.returncode != 0 and "--allow I1: I1 is an invariant of declop" in bad.stderr, bad.stderr
    bad = sim("examples/buggy/idempotence.py", "--seed", "0", "--fault", "3:crash")
    assert bad.returncode != 0 and "--fault 3:crash: want AT:KIND:REPLICA:LENGTH" in bad.stderr, bad.stderr
    bad = sim("examples/buggy/idempotence.py", "--seed", "0", "--fault", "10:pause:3:2")  # was dropped, and the seed passed
    assert bad.returncode != 0 and "--fault 10:pause:3:2: replica 3 does not exist; the run has replicas 0 to 2" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_a_sweep_in_two_processes_prints_what_one_process_prints_but_the_rate() -> None:
    """--jobs: each seed's run is a pure function of the seed, so forked workers give the same
    FAIL lines, history and shrunk schedule, in seed order; only the rate differs. The sweep's
    summary ends with the first failure's shrunk schedule."""
    one, two = sim("examples/buggy/idempotence.py", "--seeds", "4", *SMALL), sim("examples/buggy/idempotence.py", "--seeds", "4", *SMALL, "-j", "2")
    assert one.returncode == two.returncode == 1, one.stdout + two.stdout + two.stderr
    rate = re.compile(r"^4 seeds, 4 failed, [\d.]+ s: [\d.]+ schedules/s$", re.M)
    assert rate.search(one.stdout) and rate.search(two.stdout), two.stdout
    assert rate.sub("", one.stdout) == rate.sub("", two.stdout)
    fails = [line.split("  #")[0] for line in two.stdout.splitlines() if line.startswith("FAIL ")]
    assert fails == [f"FAIL declop sim examples/buggy/idempotence.py --seed {n} --objects 30 --duration 20" for n in range(4)]
    assert "\nshrunk (1 run(s)): idempotence fails without any fault:\n  declop sim examples/buggy/idempotence.py --seed 0 " in two.stdout
