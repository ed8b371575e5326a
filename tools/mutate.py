"""`make mutate`: mutation testing of the code the Lease simulator claims to prove (issue 42).

Cosmic Ray (https://cosmic-ray.readthedocs.io) makes the mutants. It was chosen over mutmut
because it writes each mutant to the file on disk and runs an arbitrary command: the simulator's
real managers, every subprocess a test starts and `python -m` all see the mutant, where mutmut 3's
trampolines live only in the copy it imports. The price is that each mutant runs the whole
command; the stages below keep that bearable.

A *group* is a set of production modules and the unit tests of them. For each group this tool

1. writes a Cosmic Ray config and session (`build/mutate/<group>.sqlite`);
2. marks *equivalent by construction* mutants skipped: every module here has
   `from __future__ import annotations`, so a mutant inside an annotation (`X | None` becomes
   `X - None`) changes nothing that runs; and, with `--sample N`, all but N mutants drawn with a
   fixed seed (a cheaper estimate, said so in the report);
3. runs the test command, `tools/mutate.py stage`, under each mutant. The stages run in order
   and the first that fails names the killer: `sweep` (the random schedules `make test` sweeps),
   `sim` (the simulator's other tests: pinned seeds, the simulated world) and `units` (the
   group's unit tests). A mutant that only the units kill counts for the combined score but not
   for the sweep's. A stage that never executes the mutated line is not run, and one that does
   runs only the tests that executed it in the baseline (coverage contexts per test: tools/mutate_contexts.py);
4. writes `build/mutate/report.md`: per group, the mutants, the skipped, what killed the rest,
   the two scores (with their 95 % interval over the group when a sample was judged), and every
   survivor's diff.

Invariant: the test command never passes by finding no test. A stage whose pytest exits 5 (no
tests collected) is an error of this tool, printed as such, and the unmutated baseline run
before each group must pass every stage or the group is not run.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import os
import random
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "mutate"

#: The search `make test` runs: random schedules of every Lease family, and of the simulated
#: world (real managers, every fault kind, the protocol-placed ones too).
SWEEP = (
    "tests/unit/testing/simulation/test_leases.py::test_random_schedules_keep_every_invariant",
    "tests/unit/testing/simulation/test_world.py::test_random_world_schedules_keep_every_invariant",
)
#: The simulator's other tests: pinned seeds of found defects and the simulated world's seeds.
SIM = (
    "tests/unit/testing/simulation/test_leases.py",
    "tests/unit/testing/simulation/test_leases_exit.py",
    "tests/unit/testing/simulation/test_leases_timers.py",
    "tests/unit/testing/simulation/test_world.py",
    "tests/unit/testing/simulation/test_world_filtered.py",
)
STAGES = ("sweep", "sim", "units")
SURVIVED = "survived"
#: What `stage` prints last: `killed-by: <stage>` or `survived`.
VERDICT = "killed-by: "


@dataclasses.dataclass(frozen=True, slots=True)
class Group:
    """Production modules to mutate and the unit tests that are theirs."""

    name: str
    modules: tuple[str, ...]
    units: tuple[str, ...]


GROUPS: dict[str, Group] = {
    g.name: g
    for g in (
        Group(
            "fence",
            ("declop/reconcile/_fence.py", "declop/kube/fencing.py"),
            ("tests/unit/reconcile/test_fence.py", "tests/unit/kube/test_fencing.py",
             "tests/unit/reconcile/test_client.py", "tests/unit/reconcile/test_controller.py"),
        ),
        Group(
            "leases",
            ("declop/leases/leader.py", "declop/leases/shards.py", "declop/leases/members.py",
             "declop/leases/ranges.py", "declop/leases/watchdog.py", "declop/leases/hashing.py"),
            ("tests/unit/leases",),
        ),
        Group(
            "manager",
            ("declop/manager/shutdown.py", "declop/manager/loss.py", "declop/manager/leadership.py"),
            ("tests/unit/manager", "tests/unit/test_manager.py"),
        ),
        Group("queue", ("declop/queue/workqueue.py", "declop/queue/ratelimit.py",
                        "declop/queue/priority.py", "declop/queue/batches.py"), ("tests/unit/queue",)),
        Group("cache", ("declop/cache/informer.py", "declop/cache/store.py", "declop/cache/watch.py",
                        "declop/cache/listing.py", "declop/cache/sharding.py", "declop/cache/backoff.py"),
              ("tests/unit/cache",)),
    )
}


# --- which mutants are skipped ---------------------------------------------------------------


def annotation_spans(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Every annotation's (start, end) as (line from 1, column from 0) pairs, as Cosmic Ray counts.

    Parameters (positional-only, keyword-only, *args, **kwargs), returns and annotated
    assignments. Columns are ast's UTF-8 offsets; the listed modules are ASCII where it matters.
    """
    spans = []
    for node in ast.walk(ast.parse(source)):
        notes: list[ast.expr | None] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            notes.append(node.returns)
            notes.extend(arg.annotation for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs))
            notes.extend(arg.annotation for arg in (a.vararg, a.kwarg) if arg is not None)
        elif isinstance(node, ast.AnnAssign):
            notes.append(node.annotation)
        spans.extend(((n.lineno, n.col_offset), (n.end_lineno or n.lineno, n.end_col_offset or 0))
                     for n in notes if n is not None)
    return spans


def in_spans(start: tuple[int, int], end: tuple[int, int],
             spans: Iterable[tuple[tuple[int, int], tuple[int, int]]]) -> bool:
    """Whether the range start..end lies wholly inside one of spans."""
    return any(s <= tuple(start) and tuple(end) <= e for s, e in spans)


def sample(job_ids: Sequence[str], keep: int, seed: int, key: Callable[[str], str] | None = None) -> set[str]:
    """The job ids left out of a sample of `keep` drawn with `seed`. With ``key`` (a job's
    mutation: module, operator, occurrence) the draw is the same in every session of the same
    code: Cosmic Ray's job ids are random, so ordered by them alone a new session drew other
    mutants for the same ``--seed``."""
    if keep >= len(job_ids):
        return set()
    kept = set(random.Random(seed).sample(sorted(job_ids, key=key), keep))
    return set(job_ids) - kept


def mutation_key(module_path: Any, operator: str, occurrence: int) -> str:
    """What names a mutant across sessions (:func:`sample`'s key)."""
    return f"{Path(module_path).as_posix()}|{operator}|{occurrence:06d}"


# --- the test command ------------------------------------------------------------------------


def pytest_base(python: Sequence[str] = (sys.executable,)) -> list[str]:
    """A stage's pytest command before its targets."""
    # no hypothesis plugin: a stage that collects no hypothesis test imports hypothesis only in
    # the plugin's terminal summary, where pytest's rewriter parses it; after the Lease sweep
    # under coverage, CPython 3.11.7's ast constructor then fails that parse with "recursion
    # depth mismatch" (python/cpython#106905) and the stage exits 1 with every test passed
    return [*python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest"]


def stage_targets(group: Group) -> list[tuple[str, list[str]]]:
    """Each stage's pytest targets (paths, node ids, ``--deselect`` pairs), in the order they run."""
    sim = [*SIM, *(a for s in SWEEP for a in ("--deselect", s))]
    return [("sweep", list(SWEEP)), ("sim", sim), ("units", list(group.units))]


def stage_commands(group: Group, python: Sequence[str] = (sys.executable,)) -> list[tuple[str, list[str]]]:
    """Each stage's pytest command, in the order they run."""
    return [(name, [*pytest_base(python), *targets]) for name, targets in stage_targets(group)]


def node_ids(contexts: Iterable[str]) -> list[str]:
    """The pytest node ids of per-test contexts (``<node id>|setup``, ``|run``, ``|teardown``:
    tools/mutate_contexts.py), each once, in order."""
    return sorted({context.rsplit("|", 1)[0] for context in contexts})


def tests_reaching(contexts: dict[str, dict[str, list[str]]] | None, changed: dict[str, set[int]]) -> set[str] | None:
    """The tests (coverage contexts) of one stage that execute a changed line; None when that is
    not known or is every test: a line run before the first test (at import, at collection) has
    the empty context, and a mutant there reaches them all."""
    if not contexts or not changed:
        return None
    reaching: set[str] = set()
    for path, lines in changed.items():
        by_line = contexts.get(path, {})
        for line in lines:
            names = by_line.get(str(line), ())
            if "" in names:
                return None
            reaching.update(names)
    return reaching or None


def spread_contexts(by_line: dict[int, Sequence[str]], starts: dict[int, int]) -> dict[str, list[str]]:
    """:func:`spread` for contexts: every line of an executed statement gets its first line's
    test functions (JSON keys: the line numbers as strings)."""
    spread_out = {str(line): sorted(names) for line, names in by_line.items()}
    for line, first in starts.items():
        if first in by_line and str(line) not in spread_out:
            spread_out[str(line)] = sorted(by_line[first])
    return spread_out


def lines_path(group: Group) -> Path:
    return BUILD / f"{group.name}.lines.json"


def contexts_path(group: Group) -> Path:
    return BUILD / f"{group.name}.contexts.json"


def mutated_lines(diff: str) -> dict[str, set[int]]:
    """The lines of each file a unified diff (``git diff -U0``) changes, in the old file's numbers."""
    changed: dict[str, set[int]] = {}
    path = None
    for line in diff.splitlines():
        if line.startswith("--- "):
            path = line[4:].removeprefix("a/") if line[4:] != "/dev/null" else None
        elif line.startswith("@@") and path is not None:
            old = line.split()[1].lstrip("-")
            start, _, count = old.partition(",")
            n = int(count) if count else 1
            changed.setdefault(path, set()).update(range(int(start), int(start) + max(n, 1)))
    return changed


def statement_lines(source: str) -> dict[int, int]:
    """Each line of ``source`` that belongs to a statement → the first line of the innermost
    statement holding it. coverage reports a statement by its first line only, so a mutant on a
    later line of it (a ``def``'s parameter list, a call spread over lines, an ``if``'s second
    condition) is reached exactly when that first line is."""
    starts: dict[int, int] = {}
    for node in ast.walk(ast.parse(source)):  # breadth first: an inner statement overrides its parent
        if isinstance(node, ast.stmt):
            for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                starts[line] = node.lineno
    return starts


def spread(covered: Iterable[int], starts: dict[int, int]) -> list[int]:
    """``covered`` (coverage's executed first lines) and every other line of those statements."""
    executed = set(covered)
    return sorted(executed | {line for line, first in starts.items() if first in executed})


def reaches(covered: dict[str, list[int]] | None, changed: dict[str, set[int]]) -> bool:
    """Whether a stage that executed ``covered`` (None: not measured) runs a changed line."""
    if covered is None or not changed:
        return True
    return any(changed_lines & set(covered.get(path, ())) for path, changed_lines in changed.items())


def run_stages(group: Group, runner=subprocess.run, changed: dict[str, set[int]] | None = None,
               covered: dict[str, dict[str, list[int]]] | None = None,
               contexts: dict[str, dict[str, dict[str, list[str]]]] | None = None) -> tuple[str, int]:
    """Run the stages until one fails: (verdict, exit code for Cosmic Ray). A stage whose measured
    coverage (``covered``, per stage) misses every ``changed`` line cannot see the mutant: it is
    not run, and does not kill it. Within a stage that does, only the tests that
    execute a changed line run (``contexts``, per stage: coverage's per-test contexts), since no
    other can fail differently — a queue mutant skips the Lease families' sweep, which never
    imports the queue."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name, targets in stage_targets(group):
        if changed is not None and covered is not None and not reaches(covered.get(name), changed):
            print(f"stage {name}: does not execute the mutated line(s), not run", flush=True)
            continue
        command = [*pytest_base(), *targets]
        reaching = tests_reaching(contexts.get(name), changed) if contexts is not None and changed else None
        ids = node_ids(reaching) if reaching is not None else None
        if ids:
            print(f"stage {name}: {len(ids)} test(s) execute the mutated line(s)", flush=True)
            command = [*pytest_base(), *ids]
        done = runner(command, cwd=ROOT, env=env)
        if done.returncode == 5:
            return f"error: stage {name} collected no test ({' '.join(command[3:])})", 2
        if done.returncode != 0:
            return VERDICT + name, 1
    return SURVIVED, 0


def verdict_of(output: str | None) -> str | None:
    """The stage a mutant's recorded output names (None when it timed out or never ran)."""
    for line in reversed((output or "").splitlines()):
        if line.startswith(VERDICT):
            return line[len(VERDICT):].strip()
        if line.strip() == SURVIVED:
            return SURVIVED
    return None


# --- the report ------------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class Tally:
    """One group's mutants by fate."""

    group: str
    total: int = 0
    equivalent: int = 0
    unsampled: int = 0
    pending: int = 0
    #: Cosmic Ray failed to make the mutant (its operator raised: an `exception` worker outcome,
    #: an `incompetent` test outcome): nothing was changed, so nothing is judged
    unmade: int = 0
    killed: dict[str, int] = dataclasses.field(default_factory=lambda: {s: 0 for s in (*STAGES, "timeout", "other")})
    survivors: list[str] = dataclasses.field(default_factory=list)

    @property
    def judged(self) -> int:
        """Mutants that ran: the scores' denominator."""
        return sum(self.killed.values()) + len(self.survivors)

    def score(self, by: Sequence[str]) -> float | None:
        """Share of judged mutants killed by the stages in `by` (timeouts count as killed)."""
        if not self.judged:
            return None
        return sum(self.killed[s] for s in (*by, "timeout", "other")) / self.judged

    def interval(self, by: Sequence[str]) -> tuple[float, float] | None:
        """The 95 % Wilson interval of :meth:`score` over the whole group when only a sample was
        judged (None when every mutant ran: the score is then the group's, not an estimate)."""
        if not self.judged or not self.unsampled:
            return None
        return wilson(sum(self.killed[s] for s in (*by, "timeout", "other")), self.judged)


#: the normal quantile of a two-sided 95 % interval
Z95 = 1.959963984540054


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval for a share ``k / n`` of Bernoulli draws. It stays inside [0, 1]
    and is not empty at 0 or n kills (7 of 7 still allows 65 %), where the normal approximation
    claims certainty. Drawing without replacement from a finite group narrows the true interval
    (by sqrt((N - n) / (N - 1))), so leaving that out errs wide, never narrow."""
    if n <= 0 or not 0 <= k <= n:
        raise ValueError(f"wilson needs 0 <= k <= n and n > 0, got k={k}, n={n}")
    p, z2 = k / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * ((p * (1 - p) / n + z2 / (4 * n * n)) ** 0.5) / (1 + z2 / n)
    # at 0 and n the bound is exactly 0 or 1 (the algebra cancels); floats need not say so
    return (0.0 if k == 0 else centre - half), (1.0 if k == n else centre + half)


def tally(group: str, items: Iterable[tuple[str, str | None, str | None, str | None]]) -> Tally:
    """Tally (worker outcome, test outcome, output, diff) rows; worker outcome None is pending."""
    t = Tally(group)
    for worker, test, output, diff in items:
        t.total += 1
        if worker is None:
            t.pending += 1
        elif worker == "skipped":
            if (output or "").startswith("not sampled"):
                t.unsampled += 1
            else:
                t.equivalent += 1
        elif worker == "exception" or test == "incompetent":
            t.unmade += 1
        elif test == "survived":
            t.survivors.append(diff or "")
        else:
            stage = verdict_of(output)
            if stage in STAGES:
                t.killed[stage] += 1
            elif output and "timeout" in output:
                t.killed["timeout"] += 1
            else:
                t.killed["other"] += 1
    return t


def percent(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


def estimate(t: Tally, by: Sequence[str]) -> str:
    """A score, with its 95 % interval over the group when it comes from a sample."""
    span = t.interval(by)
    text = percent(t.score(by))
    return text if span is None else f"{text} (95 %: {100 * span[0]:.0f}–{100 * span[1]:.0f} %)"


def render(tallies: Sequence[Tally]) -> str:
    """The markdown report: a table of scores, then every survivor's diff."""
    lines = ["# Mutation testing (tools/mutate.py)", "",
             "| group | mutants | in annotations | not sampled | pending | not made | ran | sweep | sim | units |"
             " timeout/other | survived | sweep alone | sweep+sim+units |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for t in tallies:
        k = t.killed
        lines.append(f"| {t.group} | {t.total} | {t.equivalent} | {t.unsampled} | {t.pending} | {t.unmade} | {t.judged}"
                     f" | {k['sweep']} | {k['sim']} | {k['units']} | {k['timeout'] + k['other']}"
                     f" | {len(t.survivors)} | {estimate(t, ('sweep',))} | {estimate(t, STAGES)} |")
    if any(t.interval(STAGES) for t in tallies):
        lines += ["", "A group with mutants not sampled shows estimates: the judged sample's score and, in"
                  " brackets, the 95 % Wilson interval of the whole group's score."]
    for t in tallies:
        if t.survivors:
            lines += ["", f"## Survivors: {t.group}", ""]
            for diff in t.survivors:
                lines += ["```diff", diff.rstrip(), "```"]
    return "\n".join(lines) + "\n"


# --- driving Cosmic Ray ----------------------------------------------------------------------


def config_text(group: Group, timeout: float) -> str:
    modules = ", ".join(f'"{m}"' for m in group.modules)
    command = f"{sys.executable} {Path(__file__).relative_to(ROOT)} stage {group.name}"
    return (f'[cosmic-ray]\nmodule-path = [{modules}]\ntimeout = {timeout}\nexcluded-modules = []\n'
            f'test-command = "{command}"\n\n[cosmic-ray.distributor]\nname = "local"\n')


def mark_skipped(session: Path, keep: int | None, seed: int) -> None:
    """Mark annotation mutants (and, with keep, the unsampled) skipped in a new session."""
    from cosmic_ray.work_db import use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    spans: dict[Path, list] = {}
    with use_db(str(session)) as db:
        live = []
        keys: dict[str, str] = {}
        for item in db.work_items:
            m = item.mutations[0]
            keys[item.job_id] = mutation_key(m.module_path, m.operator_name, m.occurrence)
            if m.module_path not in spans:
                spans[m.module_path] = annotation_spans((ROOT / m.module_path).read_text())
            if in_spans(tuple(m.start_pos), tuple(m.end_pos), spans[m.module_path]):
                db.set_result(item.job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED,
                                                      output="inside an annotation (never evaluated)"))
            else:
                live.append(item.job_id)
        if keep is not None:
            for job in sample(live, keep, seed, key=keys.__getitem__):
                db.set_result(job, WorkResult(worker_outcome=WorkerOutcome.SKIPPED,
                                              output=f"not sampled (--sample {keep} --seed {seed})"))


def session_rows(session: Path) -> list[tuple[str, str | None, str | None, str | None]]:
    from cosmic_ray.work_db import WorkDB, use_db

    rows = []
    with use_db(str(session), WorkDB.Mode.open) as db:
        results = dict(db.results)
        for item in db.work_items:
            r = results.get(item.job_id)
            rows.append((None, None, None, None) if r is None else
                        (r.worker_outcome.value, r.test_outcome and r.test_outcome.value, r.output, r.diff))
    return rows


def cosmic_ray(*args: str) -> int:
    return subprocess.call([str(Path(sys.executable).parent / "cosmic-ray"), *args], cwd=ROOT)


def baseline(group: Group) -> bool:
    """Every stage on the unmutated tree, under coverage: each must pass; the lines each one
    executes in the group's modules go to ``lines_path(group)``."""
    from coverage import CoverageData

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    covered: dict[str, dict[str, list[int]]] = {}
    contexts: dict[str, dict[str, dict[str, list[str]]]] = {}
    for name, command in stage_commands(group, (sys.executable, "-m", "coverage", "run")):
        data = BUILD / f"{group.name}.{name}.coverage"
        include = ",".join(str(ROOT / m) for m in group.modules)
        command[4:4] = [f"--data-file={data}", f"--include={include}"]  # after "-m coverage run"
        command[command.index("pytest") + 1:command.index("pytest") + 1] = ["-p", "tools.mutate_contexts"]  # which test ran each line
        done = subprocess.run(command, cwd=ROOT, env=env)
        if done.returncode != 0:
            print(f"[mutate] {group.name}: the unmutated tree fails stage {name} (exit {done.returncode}); fix that first",
                  file=sys.stderr)
            return False
        measured = CoverageData(basename=str(data))
        measured.read()
        covered[name], contexts[name] = {}, {}
        for f in measured.measured_files():
            path, starts = str(Path(f).relative_to(ROOT)), statement_lines(Path(f).read_text())
            covered[name][path] = spread(measured.lines(f) or (), starts)
            contexts[name][path] = spread_contexts(measured.contexts_by_lineno(f), starts)
    lines_path(group).write_text(json.dumps(covered))
    contexts_path(group).write_text(json.dumps(contexts))
    return True


def run(groups: Sequence[Group], keep: int | None, seed: int, timeout: float, fresh: bool) -> int:
    BUILD.mkdir(parents=True, exist_ok=True)
    for group in groups:
        config, session = BUILD / f"{group.name}.toml", BUILD / f"{group.name}.sqlite"
        config.write_text(config_text(group, timeout))
        if fresh or not session.exists():
            session.unlink(missing_ok=True)
            if cosmic_ray("init", str(config), str(session)):
                return 1
            mark_skipped(session, keep, seed)
            print(f"[mutate] {group.name}: baseline (every stage, no mutant, under coverage)", flush=True)
            if not baseline(group):
                return 1
        print(f"[mutate] {group.name}: running the mutants", flush=True)
        if cosmic_ray("exec", str(config), str(session)):
            return 1
    return report(list(GROUPS.values()))


def report(groups: Sequence[Group]) -> int:
    tallies = [tally(g.name, session_rows(s)) for g in groups if (s := BUILD / f"{g.name}.sqlite").exists()]
    if not tallies:
        print("[mutate] no session in build/mutate: run `make mutate` first", file=sys.stderr)
        return 1
    text = render(tallies)
    (BUILD / "report.md").write_text(text)
    print(text, end="")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/mutate.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="make and judge the mutants of the named groups (all by default)")
    p_run.add_argument("groups", nargs="*", metavar="GROUP", help=f"one of: {', '.join(GROUPS)}")
    p_run.add_argument("--sample", type=int, help="judge only this many mutants per group, drawn with --seed")
    p_run.add_argument("--seed", type=int, default=0)
    p_run.add_argument("--timeout", type=float, default=900.0, help="seconds per mutant before it counts as killed")
    p_run.add_argument("--fresh", action="store_true", help="start the sessions again (else resume them)")
    p_stage = sub.add_parser("stage", help="the test command Cosmic Ray runs under a mutant")
    p_stage.add_argument("group", choices=list(GROUPS))
    sub.add_parser("report", help="write build/mutate/report.md from the sessions")
    args = parser.parse_args(argv)
    if args.command == "stage":
        group = GROUPS[args.group]
        covered = json.loads(lines_path(group).read_text()) if lines_path(group).exists() else None
        contexts = json.loads(contexts_path(group).read_text()) if contexts_path(group).exists() else None
        diff = subprocess.run(["git", "diff", "-U0", "--", *group.modules], cwd=ROOT, capture_output=True, text=True).stdout
        verdict, code = run_stages(group, changed=mutated_lines(diff), covered=covered, contexts=contexts)
        print(verdict, flush=True)
        return code
    if args.command == "report":
        return report(list(GROUPS.values()))
    unknown = [g for g in args.groups if g not in GROUPS]
    if unknown:
        parser.error(f"no group {unknown[0]!r}: name one of {', '.join(GROUPS)}")
    groups = [GROUPS[g] for g in args.groups] or list(GROUPS.values())
    return run(groups, args.sample, args.seed, args.timeout, args.fresh)


if __name__ == "__main__":
    sys.exit(main())
