"""declop.hints: "did you mean" and the Kopf habits, as message fragments."""

from __future__ import annotations

from typing import Any

import pytest

import declop.hints as hints
from declop.hints import (
    KOPF_KWARGS,
    KOPF_OPTIONS,
    close_matches,
    did_you_mean,
    resource_in_parts,
    returned_dict,
    suggestion,
)
from declop.registry import INJECTABLE, RECONCILER_OPTIONS


def test_all_is_sorted_and_exists() -> None:
    assert hints.__all__ == sorted(hints.__all__)
    assert all(hasattr(hints, name) for name in hints.__all__)


# -- close matches ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        ("reqest", ["request"]),
        ("loger", ["logger"]),
        ("Logger", ["logger"]),  # case-insensitive, returned as given
        ("namspace", ["namespace"]),
        ("reconcileid", ["reconcile_id"]),
        ("flavour", []),
    ],
)
def test_close_matches(word: str, expected: list[str]) -> None:
    assert close_matches(word, sorted(INJECTABLE)) == expected


def test_close_matches_keeps_only_those_nearly_as_close_as_the_best() -> None:
    names = ["widgets.example.com", "gadgets.example.com", "things.a.example.com", "things.b.example.com"]
    assert close_matches("widgts.example.com", names) == ["widgets.example.com"]
    assert close_matches("things.example.com", names) == ["things.a.example.com", "things.b.example.com"]


def test_close_matches_cutoff_and_n() -> None:
    assert close_matches("log", ["logger"]) == ["logger"]  # ratio 0.67
    assert close_matches("log", ["logger"], cutoff=0.8) == []
    assert close_matches("ab", ["abc", "abd", "abe"], n=2) == ["abc", "abd"]


def test_did_you_mean_and_suggestion() -> None:
    assert did_you_mean("reqest", INJECTABLE) == "did you mean 'request'?"
    assert did_you_mean("flavour", INJECTABLE) is None
    assert suggestion([]) is None
    assert suggestion(["a"]) == "did you mean 'a'?"
    assert suggestion(["a", "b"]) == "did you mean 'a' or 'b'?"
    assert suggestion(["a", "b", "c"]) == "did you mean 'a', 'b' or 'c'?"


# -- Kopf ---------------------------------------------------------------------------------------


def test_every_kopf_kwarg_declop_lacks_has_a_hint() -> None:
    """Kopf's resource-handler kwargs (docs/kwargs.rst) that declop does not inject (old, new and
    diff it does: docs/changes.md)."""
    kopf = {
        "body", "spec", "meta", "status", "uid", "labels", "annotations", "patch", "memo", "event",
        "reason", "retry", "started", "runtime", "stopped", "param", "resource", "settings",
    }
    assert kopf <= set(KOPF_KWARGS)
    assert not set(KOPF_KWARGS) & INJECTABLE  # name, namespace and logger exist in declop too


def test_kopf_hints_are_single_lines_without_trailing_stop() -> None:
    for text in [*KOPF_KWARGS.values(), *KOPF_OPTIONS.values()]:
        assert "\n" not in text and not text.endswith(".")


def test_kopf_options_are_not_declop_options() -> None:
    assert not set(KOPF_OPTIONS) & set(RECONCILER_OPTIONS)


@pytest.mark.parametrize(
    ("parts", "expected"),
    [
        (("zalando.org", "v1", "kopfexamples"),
         "declop takes the resource as one string: @declop.reconciler('kopfexamples.zalando.org') "
         "(or 'kopfexamples.v1.zalando.org' to pin that version)"),
        (("example.com/v1beta1", "widgets"),
         "declop takes the resource as one string: @declop.reconciler('widgets.example.com') "
         "(or 'widgets.v1beta1.example.com' to pin that version)"),
        (("example.com", "widgets"), "declop takes the resource as one string: @declop.reconciler('widgets.example.com')"),
    ],
)
def test_resource_in_parts_reads_kopfs_order(parts: tuple[str, ...], expected: str) -> None:
    assert resource_in_parts(parts) == expected


@pytest.mark.parametrize(
    "parts",
    [("pods", "web"), ("pods", "example.com/cleanup"), ("pods", 3), ("a.b", "v1", "Not A Word"), ("a", "b", "c", "d")],
)
def test_resource_in_parts_otherwise_asks_for_keywords(parts: tuple[Any, ...]) -> None:
    assert resource_in_parts(parts).endswith("pass options by keyword, e.g. finalizer='my.domain/name'")


def test_returned_dict() -> None:
    hint = returned_dict({"message": "hunter2"})
    assert hint is not None
    assert "client.patch_status(request, {'status': {...}})" in hint and "return None" in hint
    assert "hunter2" not in hint
    assert returned_dict({"kind": "Secret", "metadata": {"name": "x"}}) is None  # an API object
    assert returned_dict("text") is None
    assert returned_dict(None) is None
