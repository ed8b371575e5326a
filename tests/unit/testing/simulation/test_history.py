"""declop.testing.simulation.history: each object's last rows, and the table a failing seed's report
shows of the object its first violation is about."""

from __future__ import annotations

from declop.testing import simulate
from declop.testing.simulation.leases import Violation
from declop.testing.simulation.history import ROWS, History

SMALL = {"objects": 30, "duration": 20.0}


def test_an_objects_ring_keeps_its_last_rows_in_order_and_counts_them_all() -> None:
    history = History()
    for i in range(ROWS + 4):
        history.note("ns-a/w000", float(i), "r0#1", "make_child", f"row {i}")
    table = history.table("ns-a/w000")
    assert table[0].startswith(f"the history of ns-a/w000 (its last {ROWS} of {ROWS + 4} rows")
    rows = table[2:]
    assert len(rows) == ROWS
    assert rows[0].endswith("row 4") and rows[-1].endswith(f"row {ROWS + 3}")
    assert history.table("ns-a/w001") == ()


def test_the_object_a_violation_is_about_is_the_first_it_names_that_has_a_history() -> None:
    history = History()
    history.note("ns-c/w026", 1.0, "admin", "", "created")
    orphan = Violation(9.0, "ownership", "-", "secrets ns-c/w026-child, created by make_child for ns-c/w026 at t=1.000, is left")
    assert history.about(orphan) == "ns-c/w026"  # the child has no history of its own: its primary has
    assert history.about(Violation(9.0, "I3", "-", "ns-a/w000 (uid 1234) changed at resourceVersion 1")) is None
    assert history.report(orphan)[0].startswith("the history of ns-c/w026 (1 row(s)")


def test_a_failing_seed_carries_the_history_of_its_objects_calls_and_writes() -> None:
    (result, *_) = simulate("examples/buggy/idempotence.py", seeds=1, **SMALL).failed
    first = result.violations[0]
    key = first.detail.split("one more reconcile of ", 1)[1].split()[0]
    title, header, *rows = result.history
    assert title.startswith(f"the history of {key} (") and header.split() == ["t", "by", "handler", "what"]
    assert any(" admin " in row and "created, uid " in row for row in rows)  # the workload made it
    extra = [i for i, row in enumerate(rows) if "the idempotence check's one more" in row]
    assert extra, rows
    write, end = rows[extra[-1] + 1], rows[extra[-1] + 2]  # the check's call, its write, its end
    assert " make_child " in write and f"POST secrets {key}-" in write and write.endswith(": changed")
    assert end.endswith("returned")
    assert "\n".join(result.history) in result.report()
