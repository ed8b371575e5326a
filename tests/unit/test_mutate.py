"""tools/mutate.py (make mutate): which mutants are skipped as equivalent, how a mutant's killer is
named, and how the report scores the sweep alone and every stage together. The Cosmic Ray parts
run on a real session of a real module (init takes a second); the stages are judged with a
recording runner in place of pytest, since a real stage run is minutes of sweep."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("mutate", ROOT / "tools" / "mutate.py")
assert spec and spec.loader
mutate = importlib.util.module_from_spec(spec)
sys.modules["mutate"] = mutate  # dataclasses resolve their module by name
spec.loader.exec_module(mutate)

SOURCE = '''from __future__ import annotations
def f(a: int | None, *rest: str | bytes, k: dict[str, int] | None = None, **kw: int | str) -> int | None:
    x: list[int] | None = None
    return a | 1
'''


def test_annotation_spans_cover_parameters_returns_and_annotated_names_but_not_code() -> None:
    spans = mutate.annotation_spans(SOURCE)
    lines = SOURCE.splitlines()

    def pos(line: int, text: str, nth: int = 0) -> tuple[int, int]:
        col = -1
        for _ in range(nth + 1):
            col = lines[line - 1].index(text, col + 1)
        return line, col

    for line, nth in ((2, 0), (2, 1), (2, 2), (2, 3), (2, 4), (3, 0)):
        start = pos(line, "|", nth)
        assert mutate.in_spans(start, (start[0], start[1] + 1), spans), (line, nth)
    start = pos(4, "|")
    assert not mutate.in_spans(start, (4, start[1] + 1), spans)


def test_a_sample_is_stable_for_its_seed_and_keeps_what_it_says() -> None:
    jobs = [f"j{i}" for i in range(50)]
    left_out = mutate.sample(jobs, 10, seed=3)
    assert len(left_out) == 40 and left_out == mutate.sample(list(reversed(jobs)), 10, seed=3)
    assert left_out != mutate.sample(jobs, 10, seed=4)
    assert mutate.sample(jobs, 50, seed=3) == set() == mutate.sample(jobs, 99, seed=3)


def test_the_same_seed_draws_the_same_mutants_in_a_new_session(tmp_path: Path) -> None:
    """Cosmic Ray names jobs with random ids: a sample drawn in their order drew other mutants
    in every new session, so `--sample 8 --seed 1` could not be run again on the same mutants."""
    from cosmic_ray.work_db import WorkDB, use_db

    config = tmp_path / "c.toml"
    config.write_text(mutate.config_text(mutate.Group("t", ("declop/kube/fencing.py",), ()), 60.0))
    cosmic_ray = Path(sys.executable).parent / "cosmic-ray"
    drawn = []
    for name in ("first", "second"):
        session = tmp_path / f"{name}.sqlite"
        subprocess.run([str(cosmic_ray), "init", str(config), str(session)], cwd=ROOT, check=True)
        mutate.mark_skipped(session, keep=4, seed=7)
        with use_db(str(session), WorkDB.Mode.open) as db:
            done = dict(db.results)
            drawn.append(sorted(
                mutate.mutation_key(i.mutations[0].module_path, i.mutations[0].operator_name, i.mutations[0].occurrence)
                for i in db.work_items if i.job_id not in done))
    assert len(drawn[0]) == 4 and drawn[0] == drawn[1]


def runner_failing_at(codes: dict[str, int]):
    calls: list[str] = []

    def run(command, cwd, env):
        if "tests/unit/queue" in command:
            stage = "units"
        else:
            stage = "sim" if "--deselect" in command else "sweep"
        calls.append(stage)
        assert env["PYTHONPATH"] == str(mutate.ROOT)
        return SimpleNamespace(returncode=codes.get(stage, 0))

    return run, calls


@pytest.mark.parametrize(
    ("codes", "verdict", "code", "ran"),
    [
        ({}, "survived", 0, ["sweep", "sim", "units"]),
        ({"sweep": 1}, "killed-by: sweep", 1, ["sweep"]),
        ({"sim": 1}, "killed-by: sim", 1, ["sweep", "sim"]),
        ({"units": 1}, "killed-by: units", 1, ["sweep", "sim", "units"]),
        ({"units": 2}, "killed-by: units", 1, ["sweep", "sim", "units"]),
    ],
)
def test_the_stages_run_in_order_until_one_fails_and_that_one_is_named(codes, verdict, code, ran) -> None:
    run, calls = runner_failing_at(codes)
    assert mutate.run_stages(mutate.GROUPS["queue"], runner=run) == (verdict, code)
    assert calls == ran
    assert mutate.verdict_of(f"pytest output\n{verdict}\n") == verdict.removeprefix("killed-by: ")


def test_a_stage_that_collects_no_test_is_an_error_not_a_kill_and_not_a_pass() -> None:
    run, _ = runner_failing_at({"sim": 5})
    verdict, code = mutate.run_stages(mutate.GROUPS["queue"], runner=run)
    assert code == 2 and verdict.startswith("error: stage sim collected no test")
    assert mutate.verdict_of(verdict) is None


def test_every_group_names_files_and_test_paths_that_exist() -> None:
    for group in mutate.GROUPS.values():
        for path in (*group.modules, *group.units):
            assert (ROOT / path).exists(), (group.name, path)
        for path in group.modules:  # what makes an annotation mutant equivalent
            assert "from __future__ import annotations" in (ROOT / path).read_text(), path
    assert (ROOT / mutate.SWEEP[0].split("::")[0]).exists()
    assert all((ROOT / p).exists() for p in mutate.SIM)


def test_the_report_scores_the_sweep_alone_and_all_stages_and_shows_each_survivor() -> None:
    rows = [
        ("normal", "killed", "...\nkilled-by: sweep\n", "d1"),
        ("normal", "killed", "killed-by: sweep", "d2"),
        ("normal", "killed", "killed-by: units", "d3"),
        ("normal", "killed", "timeout", "d4"),
        ("normal", "survived", "survived", "--- a\n+++ b\n-x\n+y"),
        ("skipped", None, "inside an annotation (never evaluated)", None),
        ("skipped", None, "not sampled (--sample 5 --seed 0)", None),
        (None, None, None, None),
        # Cosmic Ray's ExceptionReplacer raised making this one (leases sample, seed 1): not a kill
        ("exception", "incompetent", "AttributeError: 'PythonNode' object has no attribute 'value'", None),
    ]
    t = mutate.tally("fence", rows)
    assert (t.total, t.equivalent, t.unsampled, t.pending, t.unmade, t.judged) == (9, 1, 1, 1, 1, 5)
    assert t.score(("sweep",)) == pytest.approx(3 / 5)
    assert t.score(mutate.STAGES) == pytest.approx(4 / 5)
    text = mutate.render([t])
    # a sampled group's scores are estimates of the group's, so they carry their 95 % interval
    assert ("| fence | 9 | 1 | 1 | 1 | 1 | 5 | 2 | 0 | 1 | 1 | 1 | 60.0 % (95 %: 23–88 %) | 80.0 % (95 %: 38–96 %) |"
            in text)
    assert "## Survivors: fence" in text and "+y" in text
    assert mutate.tally("empty", []).score(mutate.STAGES) is None


def test_a_real_session_skips_annotation_mutants_and_the_unsampled(tmp_path: Path) -> None:
    group = mutate.GROUPS["fence"]
    config, session = tmp_path / "c.toml", tmp_path / "s.sqlite"
    config.write_text(mutate.config_text(mutate.Group("t", ("declop/kube/fencing.py",), ()), 60.0))
    cosmic_ray = Path(sys.executable).parent / "cosmic-ray"
    subprocess.run([str(cosmic_ray), "init", str(config), str(session)], cwd=ROOT, check=True)
    mutate.mark_skipped(session, keep=4, seed=7)
    t = mutate.tally("t", mutate.session_rows(session))
    assert t.pending == 4 and t.equivalent > 0 and t.unsampled == t.total - t.equivalent - 4
    assert "tools/mutate.py stage t" in config.read_text() and group.name == "fence"


def test_the_mutated_lines_are_read_from_git_s_diff_in_the_old_file_s_numbers() -> None:
    diff = """diff --git a/declop/x.py b/declop/x.py
--- a/declop/x.py
+++ b/declop/x.py
@@ -86 +86 @@ def enter(fence):
-    return a
+    return not a
@@ -90,2 +90,2 @@
-x
-y
+x
+z
"""
    assert mutate.mutated_lines(diff) == {"declop/x.py": {86, 90, 91}}
    assert mutate.mutated_lines("") == {}


def test_a_stage_that_never_executes_the_mutated_line_is_not_run_and_kills_nothing() -> None:
    covered = {"sweep": {"declop/x.py": [1, 2]}, "sim": {"declop/x.py": [86]}, "units": {}}
    run, calls = runner_failing_at({"sim": 1})
    assert mutate.run_stages(mutate.GROUPS["queue"], runner=run, changed={"declop/x.py": {86}}, covered=covered) == (
        "killed-by: sim", 1)
    assert calls == ["sim"]
    run, calls = runner_failing_at({})
    assert mutate.run_stages(mutate.GROUPS["queue"], runner=run, changed={"declop/x.py": {3}}, covered=covered) == (
        "survived", 0)
    assert calls == []  # no stage reaches line 3: it survives without a run
    run, calls = runner_failing_at({})
    mutate.run_stages(mutate.GROUPS["queue"], runner=run, changed={"declop/x.py": {3}}, covered=None)
    assert calls == ["sweep", "sim", "units"]  # not measured: every stage runs


def test_a_mutant_on_a_later_line_of_a_statement_is_reached_when_its_first_line_ran() -> None:
    """coverage names a statement by its first line; a mutant of a def's parameter list (Cosmic
    Ray's ``*,`` → ``<<,``, a syntax error) or of a call's second line was judged unreached and
    counted as surviving without any stage running."""
    source = """def f(
    a,
    *,
    b=1,
):
    if (a and
            b):
        return g(a,
                 b)
    return None
"""
    starts = mutate.statement_lines(source)
    assert starts[3] == 1 and starts[7] == 6 and starts[9] == 8 and starts[10] == 10
    covered = mutate.spread([1, 6, 10], starts)  # imported, called with a falsy a
    assert {1, 2, 3, 4, 5, 6, 7, 10} <= set(covered)
    assert 8 not in covered and 9 not in covered  # the return never ran: nor did its second line
    assert mutate.reaches({"declop/x.py": covered}, {"declop/x.py": {3}})
    assert not mutate.reaches({"declop/x.py": covered}, {"declop/x.py": {9}})


def test_a_whole_group_s_score_is_exact_and_carries_no_interval() -> None:
    rows = [("normal", "killed", "killed-by: sweep", "d1"), ("normal", "survived", "survived", "d2"),
            ("skipped", None, "inside an annotation (never evaluated)", None)]
    t = mutate.tally("queue", rows)
    assert t.interval(mutate.STAGES) is None
    assert "| 50.0 % | 50.0 % |" in mutate.render([t])


@pytest.mark.parametrize(("k", "n", "low", "high"), [
    (0, 10, 0.0, 0.2775),  # the textbook case: no kill in ten draws still allows 28 %
    (7, 7, 0.6457, 1.0),  # every kill in seven draws does not prove 95 %
    (5, 7, 0.3589, 0.9178),  # the leases sample's sweep alone
])
def test_wilson_s_interval_matches_the_published_values(k: int, n: int, low: float, high: float) -> None:
    assert mutate.wilson(k, n) == pytest.approx((low, high), abs=5e-5)


@given(st.integers(1, 2000).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_s_interval_holds_the_share_inside_zero_to_one_and_narrows_with_more_draws(kn: tuple[int, int]) -> None:
    k, n = kn
    low, high = mutate.wilson(k, n)
    assert 0.0 <= low <= k / n <= high <= 1.0
    assert (low == 0.0) == (k == 0) and (high == 1.0) == (k == n)
    wider_low, wider_high = mutate.wilson(k, n, z=2 * mutate.Z95)
    assert wider_low <= low and high <= wider_high
    more_low, more_high = mutate.wilson(4 * k, 4 * n)  # the same share from four times the draws
    assert more_high - more_low < high - low


def test_wilson_refuses_a_share_that_is_not_one() -> None:
    for k, n in ((1, 0), (-1, 3), (4, 3)):
        with pytest.raises(ValueError, match="0 <= k <= n"):
            mutate.wilson(k, n)


# -- per-test selection: only the test functions that execute a mutated line run ----------------


def test_per_test_contexts_become_node_ids_once_each() -> None:
    contexts = ["t/test_a.py::test_f|setup", "t/test_a.py::test_f|run", "t/test_a.py::TestC::test_m|teardown",
                "t/test_b.py::test_g[leader-0]|run"]
    assert mutate.node_ids(contexts) == ["t/test_a.py::TestC::test_m", "t/test_a.py::test_f", "t/test_b.py::test_g[leader-0]"]


def test_a_line_run_before_the_first_test_reaches_every_test_of_the_stage() -> None:
    contexts = {"declop/x.py": {"3": ["test_a.test_f"], "4": ["test_a.test_f", "test_b.test_g"], "1": [""]}}
    assert mutate.tests_reaching(contexts, {"declop/x.py": {3, 4}}) == {"test_a.test_f", "test_b.test_g"}
    assert mutate.tests_reaching(contexts, {"declop/x.py": {1, 3}}) is None  # at import: every test imports it
    assert mutate.tests_reaching(contexts, {"declop/y.py": {3}}) is None
    assert mutate.tests_reaching(None, {"declop/x.py": {3}}) is None
    spread_out = mutate.spread_contexts({6: ["test_a.test_f"]}, {6: 6, 7: 6, 8: 8})
    assert spread_out == {"6": ["test_a.test_f"], "7": ["test_a.test_f"]}  # a statement's later line


def test_a_stage_runs_only_the_tests_that_execute_the_mutant() -> None:
    commands: list[list[str]] = []

    def run(command, cwd, env):
        commands.append(command)
        return SimpleNamespace(returncode=0)

    chunk = "tests/unit/testing/simulation/test_world.py::test_random_world_schedules_keep_every_invariant[leader-0]"
    unit = "tests/unit/queue/test_ratelimit.py::test_bucket_burst_then_one_per_qps"
    covered = {"sweep": {"declop/x.py": [5, 6]}, "sim": {}, "units": {"declop/x.py": [6]}}
    contexts = {"sweep": {"declop/x.py": {"5": [f"{chunk}|run", f"{chunk}|teardown"], "6": [""]}},
                "units": {"declop/x.py": {"6": [f"{unit}|setup"]}}}
    assert mutate.run_stages(mutate.GROUPS["queue"], runner=run, changed={"declop/x.py": {5}}, covered=covered,
                             contexts=contexts) == ("survived", 0)
    assert [c[len(mutate.pytest_base()):] for c in commands] == [[chunk]]  # not the Lease sweep, nor sim and units
    commands.clear()
    mutate.run_stages(mutate.GROUPS["queue"], runner=run, changed={"declop/x.py": {6}}, covered=covered, contexts=contexts)
    assert [c[len(mutate.pytest_base()):] for c in commands] == [
        list(mutate.SWEEP),  # line 6 runs before the first test too (at import): the whole stage
        [unit],  # a fixture's setup ran it: the test it set up
    ]


def test_the_contexts_coverage_records_select_exactly_the_tests_that_ran_the_line(tmp_path: Path) -> None:
    """The real thing: `coverage run` with tools/mutate_contexts.py under pytest, its contexts
    mapped to node ids that pytest runs — a function, one parameter of a parametrized one, a
    method of a class, and a test whose fixture ran the line in its setup."""
    (tmp_path / "mod.py").write_text("X = 1\ndef f(x):\n    return x + 1\ndef g(x):\n    return x * 2\ndef h():\n    return 3\n")
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "test_m.py").write_text(
        "import pytest\nimport mod\n"
        "@pytest.fixture\ndef three():\n    return mod.h()\n"
        "def test_f():\n    assert mod.f(1) == 2\n"
        "@pytest.mark.parametrize('v', [1, 2])\ndef test_g(v):\n    assert v == 2 or mod.g(v) == 2\n"
        "class TestC:\n    def test_h(self):\n        assert mod.f(0) == 1\n"
        "def test_uses_three(three):\n    assert three == 3\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{mutate.ROOT}"}
    subprocess.run([sys.executable, "-m", "coverage", "run", "--data-file=d", f"--include={tmp_path / 'mod.py'}",
                    "-m", "pytest", "-p", "tools.mutate_contexts", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "t"],
                   cwd=tmp_path, env=env, check=True, capture_output=True)
    from coverage import CoverageData

    data = CoverageData(basename=str(tmp_path / "d"))
    data.read()
    by_line = data.contexts_by_lineno(str(tmp_path / "mod.py"))
    contexts = {"mod.py": mutate.spread_contexts(by_line, mutate.statement_lines((tmp_path / "mod.py").read_text()))}
    assert mutate.tests_reaching(contexts, {"mod.py": {1}}) is None  # module level: at import

    def selected(line: int) -> tuple[list[str], str]:
        ids = mutate.node_ids(mutate.tests_reaching(contexts, {"mod.py": {line}}) or ())
        ran = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "no:randomly", *ids],
                             cwd=tmp_path, env=env, capture_output=True, text=True)
        assert ran.returncode == 0, ran.stdout
        return ids, ran.stdout

    ids, out = selected(3)
    assert ids == ["t/test_m.py::TestC::test_h", "t/test_m.py::test_f"] and out.count(" PASSED") == 2, out
    ids, out = selected(5)
    assert ids == ["t/test_m.py::test_g[1]"] and out.count(" PASSED") == 1, out  # only the parameter that ran it
    ids, out = selected(7)
    assert ids == ["t/test_m.py::test_uses_three"] and out.count(" PASSED") == 1, out  # its fixture's setup ran it
