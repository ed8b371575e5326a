"""declop.reconcile.result: Result validation and the phase table of ``phase_of``."""

from __future__ import annotations

from typing import Any

import pytest

import declop
from declop.reconcile.result import Phase, Result, describe, phase_of

FIN = "example.com/cleanup"


def obj(**meta: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": "default", "name": "x", **meta}}


def test_result_defaults_to_no_requeue() -> None:
    assert Result().requeue_after is None
    assert Result() == Result(None)


@pytest.mark.parametrize("seconds", [0, 0.0, 0.5, 30])
def test_result_accepts_non_negative_requeue_after(seconds: float) -> None:
    assert Result(requeue_after=seconds).requeue_after == seconds


@pytest.mark.parametrize("seconds", [-1, -0.001, float("nan"), float("inf"), float("-inf")])
def test_result_rejects_negative_and_non_finite_requeue_after(seconds: float) -> None:
    with pytest.raises(ValueError, match=r"requeue_after must be a finite number of seconds >= 0, got .*; return Result\(\) for no requeue"):
        Result(requeue_after=seconds)


@pytest.mark.parametrize("value", ["5", True, [1]])
def test_result_rejects_what_is_not_a_number(value: Any) -> None:
    with pytest.raises(TypeError, match="requeue_after must be a number of seconds or None"):
        Result(requeue_after=value)


@pytest.mark.parametrize("value", ["5", -1, float("nan"), {"kind": "Secret"}])
def test_an_invalid_result_is_terminal(value: Any) -> None:
    with pytest.raises(declop.TerminalError) as info:
        Result(requeue_after=value)
    assert isinstance(info.value, declop.errors.InvalidResult)


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (None, "None"),
        (3.5, "3.5"),
        ("5", "'5'"),
        ("x" * 21, "a str of 21 characters"),
        ({"kind": "Secret", "metadata": {"namespace": "ns", "name": "db"}, "data": {"p": "eA=="}},
         "a Secret object ns/db (contents not shown)"),
        ({"kind": "Namespace", "metadata": {"name": "n"}}, "a Namespace object n (contents not shown)"),
        ({"password": "x"}, "a dict (contents not shown)"),
        ([1, 2], "a list (contents not shown)"),
    ],
)
def test_describe_names_the_type_never_the_contents(value: Any, shown: str) -> None:
    assert describe(value) == shown


def test_phase_repr() -> None:
    assert repr(Phase.CREATED) == "Phase.CREATED"


# -- the phase table ----------------------------------------------------------------------


@pytest.mark.parametrize("finalizer", [FIN, None])
def test_no_object_is_deleted(finalizer: str | None) -> None:
    assert phase_of(None, finalizer) is Phase.DELETED


@pytest.mark.parametrize(
    ("finalizers", "finalizer"),
    [
        ([FIN], FIN),  # with our finalizer
        (["other.io/x"], FIN),  # without ours
        (None, FIN),
        ([FIN], None),  # no finalizer configured
        (None, None),
    ],
)
def test_deletion_timestamp_is_deleting(
    finalizers: list[str] | None, finalizer: str | None
) -> None:
    o = obj(deletionTimestamp="2024-01-01T00:00:00Z")
    if finalizers is not None:
        o["metadata"]["finalizers"] = finalizers
    assert phase_of(o, finalizer) is Phase.DELETING


@pytest.mark.parametrize("finalizers", [None, [], ["other.io/x"]])
def test_missing_finalizer_is_created(finalizers: list[str] | None) -> None:
    o = obj() if finalizers is None else obj(finalizers=finalizers)
    assert phase_of(o, FIN) is Phase.CREATED


@pytest.mark.parametrize("finalizers", [[FIN], ["other.io/x", FIN]])
def test_present_finalizer_is_updated(finalizers: list[str]) -> None:
    assert phase_of(obj(finalizers=finalizers), FIN) is Phase.UPDATED


@pytest.mark.parametrize("finalizers", [None, [], ["other.io/x"], [FIN]])
def test_without_configured_finalizer_never_created(finalizers: list[str] | None) -> None:
    o = obj() if finalizers is None else obj(finalizers=finalizers)
    assert phase_of(o, None) is Phase.UPDATED


def test_object_without_metadata_is_read_safely() -> None:
    assert phase_of({}, FIN) is Phase.CREATED
    assert phase_of({"metadata": None}, None) is Phase.UPDATED
