"""declop.handlers.returns: a return value written to the status with return_to= (issue 41)."""

from __future__ import annotations

from typing import Any

import pytest

import declop
from declop.errors import InvalidResult, RegistrationError
from declop.handlers.returns import path_of
from declop.registry import Registry
from declop.testing import run_reconcile


def cm(status: dict[str, Any] | None = None, **data: str) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "default"}, "data": data}
    if status is not None:
        obj["status"] = status
    return obj


def registered(fn: Any, **options: Any) -> Registry:
    reg = Registry()
    reg.reconciler("configmaps", **options)(fn)
    return reg


def test_the_value_is_written_at_its_path_alone_and_only_when_it_differs() -> None:
    def summary(obj: Any, **_: Any) -> dict[str, Any]:
        return {"keys": sorted(obj["data"])}

    reg = registered(summary, return_to="status.summary")
    out = run_reconcile(summary, "default/x", [cm({"other": "kept"}, a="1")], registry=reg)
    assert out.action == "done"
    assert [(w.verb, w.body) for w in out.writes] == [("patch_status", {"status": {"summary": {"keys": ["a"]}}})]
    assert out.client.get("configmaps", "default/x")["status"] == {"other": "kept", "summary": {"keys": ["a"]}}
    again = run_reconcile(summary, "default/x", client=out.client, registry=reg)
    assert again.writes == ()  # converged: no write


def test_return_to_true_is_status_of_the_controller_name_as_kopf() -> None:
    def child(**_: Any) -> str:
        return "made"

    reg = registered(child, return_to=True)
    out = run_reconcile(child, "default/x", [cm()], registry=reg)
    assert out.writes[0].body == {"status": {"child": "made"}}
    assert path_of(True, "child") == ("status", "child")


def test_none_and_result_keep_their_meaning_and_write_nothing() -> None:
    def later(**_: Any) -> declop.Result:
        return declop.Result(requeue_after=5)

    reg = registered(later, return_to="status.x")
    out = run_reconcile(later, "default/x", [cm()], registry=reg)
    assert out.action == "requeue_after" and out.requeue_after == 5 and out.writes == ()


def test_a_handler_that_changes_its_obj_does_not_hide_the_difference() -> None:
    def sneaky(obj: Any, **_: Any) -> int:
        obj.setdefault("status", {})["n"] = 3  # its own copy: not the object
        return 3

    reg = registered(sneaky, return_to="status.n")
    out = run_reconcile(sneaky, "default/x", [cm()], registry=reg)
    assert [w.body for w in out.writes] == [{"status": {"n": 3}}]


def test_a_raising_handler_writes_nothing() -> None:
    def boom(**_: Any) -> int:
        raise RuntimeError("no")

    reg = registered(boom, return_to="status.n")
    out = run_reconcile(boom, "default/x", [cm()], registry=reg)
    assert out.action == "retry" and out.writes == ()


def test_a_value_that_is_not_json_is_a_terminal_error_naming_the_path() -> None:
    def odd(**_: Any) -> object:
        return object()

    reg = registered(odd, return_to="status.n")
    out = run_reconcile(odd, "default/x", [cm()], registry=reg)
    assert out.action == "terminal" and isinstance(out.error, InvalidResult)
    assert "goes to status.n (return_to=)" in str(out.error) and out.writes == ()


def test_an_async_handler_too() -> None:
    async def summary(**_: Any) -> list[int]:
        return [1, 2]

    reg = registered(summary, return_to="status.items")
    out = run_reconcile(summary, "default/x", [cm()], registry=reg)
    assert [w.body for w in out.writes] == [{"status": {"items": [1, 2]}}]


@pytest.mark.parametrize("bad", ["summary", "spec.x", "status.", 3])
def test_return_to_outside_the_status_is_refused_at_the_decorator(bad: Any) -> None:
    with pytest.raises(RegistrationError, match="return_to= names where the return value goes in the status"):
        declop.reconciler("configmaps", return_to=bad, registry=Registry())


def test_without_return_to_a_returned_dict_is_still_invalid_and_says_how() -> None:
    def kopfish(**_: Any) -> dict[str, str]:
        return {"a": "b"}

    reg = registered(kopfish)
    assert reg.registrations[0].fn is kopfish  # not wrapped: pays nothing
    out = run_reconcile(kopfish, "default/x", [cm()], registry=reg)
    assert out.action == "terminal" and "return_to='status.<field>'" in str(out.error)
