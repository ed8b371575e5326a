"""The outcome table as data: declop.reconcile._outcome's Verdict, classify and apply, checked
against each other, against the metric labels and against docs/contract.md §3."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import declop
from declop.errors import ApiError, Conflict, Fenced, InvalidObject, InvalidResult, NotFound
from declop.kube.discovery import ResourceInfo
from declop.kube.keys import Request
from declop.reconcile._call import Call
from declop.reconcile._keys import FinalizerWrites, KeyNotes
from declop.reconcile._outcome import QUEUE, Verdict, _release_left, apply, classify, invalid_outcome
from declop.serving.metrics import RESULTS

CONTRACT = Path(__file__).resolve().parents[3] / "docs" / "contract.md"
KEY = Request("ns", "a")


def contract_rows() -> list[tuple[str, str, tuple[str, ...]]]:
    """(the handler…, the result label, the queue operations) of each row of §3's table."""
    text = CONTRACT.read_text()
    section = text[text.index("## 3. Outcomes") : text.index("## 4. ")]
    rows = []
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith("| the handler"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == 3, line
        label = re.fullmatch(r"`(\w+)`", cells[1])
        assert label is not None, cells[1]
        ops = re.findall(r"`(\w+)`", cells[2].split(":", 1)[0])
        rows.append((cells[0], label.group(1), tuple(ops)))
    return rows


def test_the_contract_table_is_the_enum_and_its_queue_operations() -> None:
    rows = contract_rows()
    assert {label for _, label, _ in rows} == {v.value for v in Verdict}
    for _, label, ops in rows:
        assert QUEUE[Verdict(label)] == ops, label


def test_the_metric_labels_are_the_verdicts() -> None:
    assert set(RESULTS) == {v.value for v in Verdict}


class Recording:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def forget(self, key: Request) -> None:
        self.calls.append("forget")

    def add_after(self, key: Request, seconds: float) -> None:
        self.calls.append("add_after")

    def add_rate_limited(self, key: Request) -> None:
        self.calls.append("add_rate_limited")


@pytest.mark.parametrize("verdict", list(Verdict))
def test_apply_does_what_the_table_says(verdict: Verdict) -> None:
    queue, notes = Recording(), KeyNotes()
    apply(queue, notes, KEY, verdict, 5.0, RuntimeError("x"))  # type: ignore[arg-type]
    assert tuple(queue.calls) == QUEUE[verdict]
    delayed = {
        Verdict.ERROR: ("retry", "RuntimeError"),
        Verdict.TEMPORARY_ERROR: ("retry", "RuntimeError"),
        Verdict.REQUEUE_AFTER: ("requeue_after", None),
    }
    assert notes.pending(KEY) == delayed.get(verdict)


def test_a_conflict_is_noted_as_such() -> None:
    notes = KeyNotes()
    apply(Recording(), notes, KEY, Verdict.ERROR, 0.0, Conflict("409"))  # type: ignore[arg-type]
    assert notes.pending(KEY) == ("retry", "Conflict")


@pytest.mark.parametrize(
    ("outcome", "error", "expected"),
    [
        (None, None, (Verdict.SUCCESS, 0.0)),
        (declop.Result(), None, (Verdict.SUCCESS, 0.0)),
        (declop.Result(requeue_after=0), None, (Verdict.SUCCESS, 0.0)),
        (declop.Result(requeue_after=30), None, (Verdict.REQUEUE_AFTER, 30)),
        (declop.Result(requeue_after=30), RuntimeError("x"), (Verdict.ERROR, 0.0)),
        (None, Conflict("409"), (Verdict.ERROR, 0.0)),
        (None, declop.TerminalError("bad"), (Verdict.TERMINAL_ERROR, 0.0)),
        (None, InvalidResult("bad"), (Verdict.TERMINAL_ERROR, 0.0)),
        (None, Fenced("refused"), (Verdict.FENCED, 0.0)),
        (None, declop.TemporaryError("later", delay=12), (Verdict.TEMPORARY_ERROR, 12.0)),
        (declop.Result(requeue_after=30), declop.TemporaryError("later", delay=0), (Verdict.TEMPORARY_ERROR, 0.0)),
    ],
)
def test_classify_is_the_first_matching_row(outcome: Any, error: BaseException | None, expected: tuple[Verdict, float]) -> None:
    assert classify(outcome, error) == expected


def test_an_object_failing_its_model_is_terminal() -> None:
    error = InvalidObject("7", ("spec.replicas: Input should be less than or equal to 10",))
    assert classify(None, error) == (Verdict.TERMINAL_ERROR, 0.0)


def test_an_outcome_that_is_no_outcome_is_terminal() -> None:
    error = invalid_outcome("h", KEY, True)
    assert isinstance(error, InvalidResult) and classify(True, error) == (Verdict.TERMINAL_ERROR, 0.0)


class Delays(Recording):
    def __init__(self) -> None:
        super().__init__()
        self.delays: list[float] = []

    def add_after(self, key: Request, seconds: float) -> None:
        super().add_after(key, seconds)
        self.delays.append(seconds)


def test_a_temporary_error_is_added_back_after_its_delay_and_keeps_the_backoff_count() -> None:
    queue, notes = Delays(), KeyNotes()
    error = declop.TemporaryError("not ready", delay=7.5)
    verdict, delay = classify(None, error)
    apply(queue, notes, KEY, verdict, delay, error)  # type: ignore[arg-type]
    assert queue.calls == ["add_after"] and queue.delays == [7.5]  # no forget: the failures count on
    assert notes.pending(KEY) == ("retry", "TemporaryError")


@pytest.mark.parametrize("delay", [-1, float("nan"), float("inf"), "5", True])
def test_a_temporary_error_refuses_a_delay_that_is_no_delay(delay: Any) -> None:
    with pytest.raises(ValueError, match="finite number of seconds"):
        declop.TemporaryError("x", delay=delay)


# -- the release of our finalizer from an object that left a labels= filter ----------------------

FIN = "example.com/cleanup"
CONFIGMAPS = ResourceInfo(group="", version="v1", plural="configmaps", kind="ConfigMap", namespaced=True)


def _cm(app: str, finalizers: list[str], uid: str = "u1") -> dict[str, Any]:
    meta = {"name": "a", "namespace": "ns", "uid": uid, "labels": {"app": app}, "finalizers": finalizers}
    return {"metadata": meta}


class _Transport:
    """Answers GET with ``stored`` (None: 404) and records every request."""

    def __init__(self, stored: Any, refuse: int | None = None) -> None:
        self.stored, self.refuse = stored, refuse
        self.requests: list[tuple[str, str, Any]] = []

    async def request(self, method: str, path: str, *, body: Any = None, content_type: str | None = None) -> Any:
        self.requests.append((method, path, body))
        if method == "GET":
            if self.stored is None:
                raise NotFound("gone")
            return self.stored
        if self.refuse is not None:
            raise ApiError(self.refuse, "InternalError", "refused")
        return self.stored


class _Pool:
    def __init__(self, cached: Any | None) -> None:
        self.cached = cached

    def existing(self, resource: ResourceInfo) -> list[Any]:
        if self.cached is None:
            return []
        store = {KEY: self.cached} if self.cached else {}
        return [SimpleNamespace(namespace="", store=store)]


def _state(transport: _Transport, pool: _Pool) -> Any:
    echoes = FinalizerWrites()
    echoes.left[KEY] = "u1"
    registration = SimpleNamespace(finalizer=FIN, labels="app=web", fields="")
    ctx = SimpleNamespace(transport=transport, informers=pool)
    return SimpleNamespace(echoes=echoes, registration=registration, ctx=ctx, resource=CONFIGMAPS)


def _call() -> Any:
    call = Call(KEY, 0.0, "r1")
    call.logger = SimpleNamespace(info=lambda *a, **kw: None)  # type: ignore[assignment]
    return call


@pytest.mark.parametrize("cached", [None, {}], ids=["from the apiserver", "from the unfiltered cache"])
def test_an_object_outside_the_filter_has_only_our_finalizer_removed_by_uid(cached: Any) -> None:
    stored = _cm("db", ["other.io/keep", FIN])
    pool = _Pool(stored if cached is not None else None)
    c = _state(t := _Transport(stored), pool)
    asyncio.run(_release_left(c, _call()))
    writes = [r for r in t.requests if r[0] != "GET"]
    assert [(m, p) for m, p, _ in writes] == [("PATCH", "/api/v1/namespaces/ns/configmaps/a")]
    ops = writes[0][2]
    assert {"op": "test", "path": "/metadata/uid", "value": "u1"} in ops
    assert {"op": "remove", "path": "/metadata/finalizers/1"} in ops and len([o for o in ops if o["op"] == "remove"]) == 1
    assert (any(r[0] == "GET" for r in t.requests)) == (cached is None)  # no read when a cache has it
    assert KEY not in c.echoes.left


def test_a_copy_still_in_the_filter_keeps_the_finalizer_and_the_note() -> None:
    # a lagging unfiltered cache (or the object came back): the cache's catching up wakes the key
    c = _state(t := _Transport(None), _Pool(_cm("web", [FIN])))
    asyncio.run(_release_left(c, _call()))
    assert t.requests == [] and c.echoes.left == {KEY: "u1"}


@pytest.mark.parametrize(
    "stored", [None, _cm("db", [FIN], uid="u2"), _cm("db", [])], ids=["gone", "a namesake", "released already"]
)
def test_nothing_to_release_drops_the_note(stored: Any) -> None:
    c = _state(t := _Transport(stored), _Pool(None))
    asyncio.run(_release_left(c, _call()))
    assert [r[0] for r in t.requests] == ["GET"] and KEY not in c.echoes.left


def test_a_refused_release_is_the_calls_error_and_keeps_the_note() -> None:
    c = _state(_Transport(_cm("db", [FIN]), refuse=500), _Pool(None))
    with pytest.raises(ApiError):
        asyncio.run(_release_left(c, _call()))
    assert c.echoes.left == {KEY: "u1"}  # retried with backoff: the next DELETED call tries again
