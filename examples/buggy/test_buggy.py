"""The gallery of buggy handlers is a test: ``declop sim`` finds each bug, names the property and
the handler's line, and passes the fixed version (docs/simulation.md, "Properties of your handlers").

    pytest examples/buggy/test_buggy.py

Each case runs ``declop sim`` as a user would — a process, from the repository's root — and reads
what it prints: the failing seed's line (``FAIL declop sim FILE --seed N  # t=… PROPERTY …``),
the handler's line under it, then the one-seed report that line reproduces: the history of the
object the violation is about and the seed shrunk to the faults it needs.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
SEEDS = "20"  # a few seconds each; the 1,000-seed figures are in docs/simulation.md


def sim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "declop", "sim", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def line_of(path: Path, text: str) -> int:
    (number,) = [i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line]
    return number


@pytest.mark.parametrize(
    "name, prop, write",
    [
        ("idempotence.py", "idempotence", 'client.create("secrets"'),
        ("hot_loop.py", "quiescence", 'client.patch("configmaps"'),
        ("conflict.py", "conflicts", 'client.patch("configmaps"'),
        ("orphan.py", "ownership", 'client.create("secrets"'),
        ("crash.py", "crash-safety", 'made = client.create("secrets"'),
        ("cleanup.py", "finalizers", 'record = client.get("secrets", name)'),
    ],
)
def test_a_buggy_handler_fails_naming_the_property_and_the_line_of_its_write(name: str, prop: str, write: str) -> None:
    path = f"examples/buggy/{name}"
    out = sim(path, "--seeds", "5")
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    fails = [i for i, line in enumerate(lines) if line.startswith("FAIL ")]
    assert fails, out.stdout
    first = lines[fails[0]]
    repro = re.match(r"FAIL (declop sim \S+ --seed \d+)  # t=[\d.]+ ([\w-]+) ", first)
    assert repro is not None and repro[2] == prop, first
    where = f'File "{path}", line {line_of(ROOT / path, write)}, in '
    assert lines[fails[0] + 1].strip().startswith(where), out.stdout
    assert write in lines[fails[0] + 2], out.stdout
    if prop == "quiescence":  # the cycle, in virtual seconds
        assert "→ event → handler count of the same object again" in first and "virtual s" in first, first
    if prop == "conflicts":  # what to do instead
        assert "ended with TerminalError" in first and "transient and must be retried" in first, first
    if prop == "ownership":  # the orphan, and what its primary was
        assert re.search(r" -: secrets \S+-child, created by make_child for \S+ at t=[\d.]+, is left after ", first), first
    if prop == "crash-safety":  # the duplicate, the child it duplicates, and the crash point
        assert re.search(r" -: \S+ has \d+ secrets created by make_child, where a primary no crash touched has at most 1: secrets \S+, created at t=[\d.]+, duplicates secrets \S+, created at t=[\d.]+ by a call killed before its next write \(r\d#\d+ was killed at t=[\d.]+ right after write 1 of handler make_child for \S+ \(POST secrets ", first), first
    if prop == "finalizers":  # the stuck object, its finalizer, the last cleanup's exception, what to do
        assert re.search(r" -: configmaps \S+ \(uid \w+\), deleted at t=[\d.]+, is still being deleted ", first), first
        assert "held by finalizer example.com/release-lease: its cleanup (lease, DELETING) raised " in first, first
        assert "NotFound: secrets " in first and "treat NotFound (404) of what it deletes as done" in first, first

    # the one line reproduces it: the same property, the same handler line
    again = sim(*repro[1].split()[2:])
    assert again.returncode == 1, again.stdout
    assert f" {prop} -: " in again.stdout and where in again.stdout, again.stdout
    assert re.search(r"ended: (quiescence|end|steps|time), at [\d,]+ of [\d,]+ steps, bound t=", again.stdout), again.stdout
    # with the history of the object it is about, and its schedule shrunk to one line of its own
    table = again.stdout.split("\nthe history of ", 1)[1].splitlines()
    assert table[1].split() == ["t", "by", "handler", "what"] and any(re.search(r" r\d#\d +\w+ +call \(", row) for row in table[2:]), again.stdout
    shrunk = again.stdout.split("\nshrunk (", 1)[1].splitlines()
    assert f" {prop} " in shrunk[0] and shrunk[-1].strip().startswith(f"{repro[1]} --"), again.stdout


@pytest.mark.parametrize(
    "name", ["idempotence_fixed.py", "hot_loop_fixed.py", "conflict_fixed.py", "orphan_fixed.py", "crash_fixed.py", "cleanup_fixed.py", "namespaced.py"]
)
def test_the_fixed_and_the_correct_handlers_pass(name: str) -> None:
    out = sim(f"examples/buggy/{name}", "--seeds", SEEDS)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{SEEDS} seeds, 0 failed" in out.stdout, out.stdout
