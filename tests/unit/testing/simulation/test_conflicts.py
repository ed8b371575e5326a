"""The conflicts property (declop.testing.simulation.conflicts): some of the handlers' writes are
answered 409, 429 or 5xx while the workload runs; the world still converges, and a call that
gives up on one with TerminalError is reported with the line of its refused write."""

from __future__ import annotations

import functools
from typing import Any

import pytest

import declop
from declop.errors import ApiError, Conflict
from declop.kube.keys import Request
from declop.registry import Registry
from declop.testing.simulation import world as simworld
from declop.testing.simulation.conflicts import Conflicts, refusal
from declop.testing.simulation.props import Call
from declop.testing.simulation.world import World, run

KEY = Request("ns-a", "w000")
TRACE = ('File "h.py", line 9, in stamp', "  client.patch(...)")
WORLD = World(handlers="handlers.py", objects=40, duration=45.0, faults=())  # the first calls come at t≈26


def _call(at: float = 1.0) -> Call:
    return Call("stamp", KEY, at)


def test_refusals_are_the_errors_a_client_raises_throttles_with_retry_after() -> None:
    assert isinstance(refusal(409, "m"), Conflict)
    for status, reason in ((429, "TooManyRequests"), (503, "ServiceUnavailable")):
        e = refusal(status, "m")
        assert (e.status, e.reason, e.retry_after) == (status, reason, 1.0)
    assert (refusal(500, "m").status, refusal(500, "m").retry_after) == (500, None)


def test_updates_get_409s_and_throttles_other_writes_throttles_only_drawn_from_the_seed() -> None:
    always = Conflicts(7, rate=1.0)
    updates = {type(always.answer(1.0, m, "configmaps ns-a/w000", _call(), TRACE)).__name__ for m in ("PUT", "PATCH") * 40}
    assert updates == {"Conflict", "ApiError"}
    others = {always.answer(1.0, m, "secrets ns-a/x", _call(), TRACE).status for m in ("POST", "DELETE") * 40}  # type: ignore[union-attr]
    assert others == {429, 503, 500}
    assert always.refused == 160
    assert Conflicts(7, rate=0.0).answer(1.0, "PATCH", "t", _call(), TRACE) is None
    a, b = Conflicts(3), Conflicts(3)
    draws = [(x.answer(1.0, "PATCH", "t", _call(), TRACE) is None) for x in (a, b) for _ in range(200)]
    assert draws[:200] == draws[200:] and 0 < draws.count(False) < 40  # the same per seed; ~5%


def test_a_terminal_error_right_after_a_refusal_is_reported_once_with_the_write_s_line() -> None:
    c = Conflicts(0, rate=1.0)
    call, other = _call(1.0), _call(2.0)
    c.answer(1.0, "PATCH", "configmaps ns-a/w000", call, TRACE)
    v = c.ended(1.5, call, declop.TerminalError("cannot"))
    assert v is not None and v.invariant == "conflicts" and v.trace == TRACE
    assert "ended with TerminalError at t=1.500" in v.detail and "PATCH configmaps ns-a/w000 was answered" in v.detail
    assert "transient and must be retried" in v.detail and "declop.TemporaryError" in v.detail
    c.answer(2.0, "PATCH", "configmaps ns-a/w000", other, TRACE)
    assert c.ended(2.5, other, declop.TerminalError("again")) is None  # counted, not reported twice
    assert c.gave_up == 2 and c.violation is v


def test_a_write_served_after_a_refusal_or_the_call_s_end_clears_it() -> None:
    c = Conflicts(0, rate=1.0)
    call = _call()
    c.answer(1.0, "PATCH", "t", call, TRACE)
    c.rate = 0.0
    c.answer(1.1, "PATCH", "t", call, TRACE)  # the retry inside the call went through
    assert c.ended(1.2, call, declop.TerminalError("later, for another reason")) is None
    c.rate = 1.0
    c.answer(1.3, "PATCH", "t", call, TRACE)
    c.forget(call)
    assert c.ended(1.4, call, declop.TerminalError("x")) is None and c.ended(1.4, None, declop.TerminalError("x")) is None
    assert not c.last


# -- world runs -------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def often(monkeypatch: pytest.MonkeyPatch) -> None:
    """A small world sends few writes: refuse a third of them, not one in twenty."""
    monkeypatch.setattr(simworld, "Conflicts", functools.partial(Conflicts, rate=0.3))


def _registry(handler: Any) -> Registry:
    registry = Registry()
    registry.reconciler("configmaps")(handler)
    return registry


def gives_up(request: Any, client: Any, obj: Any) -> None:
    if obj is not None and (obj["metadata"].get("labels") or {}).get("seen") != "yes":
        try:
            client.patch("configmaps", request, {"metadata": {"labels": {"seen": "yes"}}})
        except ApiError as exc:
            raise declop.TerminalError("gave up") from exc


def retries(request: Any, client: Any, obj: Any) -> None:
    if obj is not None and (obj["metadata"].get("labels") or {}).get("seen") != "yes":
        client.patch("configmaps", request, {"metadata": {"labels": {"seen": "yes"}}})


def test_a_handler_that_turns_a_conflict_into_a_terminal_error_fails_conflicts_with_its_line() -> None:
    result = run(WORLD, 0, _registry(gives_up))
    v = result.violations[0]
    assert v.invariant == "conflicts", result.report()
    assert v.at < simworld.calm(WORLD, [])  # refusals only while the workload runs
    assert v.trace[-2].endswith("in gives_up") and "client.patch" in v.trace[-1]


@pytest.mark.parametrize("seed", range(3))
def test_a_handler_that_lets_refusals_propagate_converges(seed: int) -> None:
    result = run(WORLD, seed, _registry(retries))
    assert result.ok, result.report()
    refused = int(result.writes.split("refused (409, 429, 5xx): ", 1)[1].split(";", 1)[0])
    assert refused > 0, result.writes


def test_the_built_in_world_draws_no_refusals() -> None:
    result = run(World(objects=20, duration=10.0), 0)
    assert result.writes == "" and "refused" not in result.report()
