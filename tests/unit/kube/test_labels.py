"""declop.kube.labels: kubectl selector syntax parsed once into an immutable, callable Selector."""

from __future__ import annotations

import dataclasses

import pytest

from declop.kube.labels import Selector, parse_selector

WEB = {"app": "web", "tier": "frontend"}
DB = {"app": "db", "tier": "backend"}
NONE: dict[str, str] = {}


@pytest.mark.parametrize(
    ("text", "labels", "expected"),
    [
        ("app=web", WEB, True),
        ("app=web", DB, False),
        ("app=web", NONE, False),
        ("app==web", WEB, True),
        ("app==web", DB, False),
        ("app!=web", WEB, False),
        ("app!=web", DB, True),
        ("app!=web", NONE, True),  # != matches objects without the key, as in Kubernetes
        ("app in (web,db)", WEB, True),
        ("app in (web,db)", DB, True),
        ("app in (api)", WEB, False),
        ("app in (web)", NONE, False),
        ("app notin (web)", WEB, False),
        ("app notin (web)", DB, True),
        ("app notin (web)", NONE, True),
        ("app", WEB, True),
        ("app", NONE, False),
        ("!app", WEB, False),
        ("!app", NONE, True),
        ("app=", {"app": ""}, True),
        ("app=", WEB, False),
    ],
)
def test_single_requirement(text: str, labels: dict[str, str], expected: bool) -> None:
    assert parse_selector(text)(labels) is expected


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        (WEB, True),
        ({"app": "web", "tier": "backend"}, False),  # tier notin
        ({"app": "api", "tier": "frontend"}, True),
        ({"app": "db", "tier": "frontend"}, False),  # app in
        ({"app": "web"}, False),  # tier must exist
        ({"app": "web", "tier": "frontend", "canary": "true"}, False),  # !canary
    ],
)
def test_combined_requirements_all_must_hold(labels: dict[str, str], expected: bool) -> None:
    sel = parse_selector("app in (web, api),tier, tier notin (backend), !canary")
    assert sel(labels) is expected


def test_whitespace_is_tolerated() -> None:
    sel = parse_selector("  app = web ,  tier != db  ")
    assert sel({"app": "web", "tier": "x"})
    assert str(sel) == "app=web,tier!=db"


def test_prefixed_keys() -> None:
    sel = parse_selector("app.kubernetes.io/name=nginx,!example.com/skip")
    assert sel({"app.kubernetes.io/name": "nginx"})
    assert not sel({"app.kubernetes.io/name": "nginx", "example.com/skip": ""})


def test_dict_form_matches_exactly() -> None:
    sel = parse_selector({"tier": "frontend", "app": "web"})
    assert sel(WEB)
    assert not sel(DB)
    assert not sel({"app": "web"})
    assert str(sel) == "app=web,tier=frontend"  # sorted by key


def test_empty_selector_matches_everything() -> None:
    for empty in (None, "", "   ", {}):
        sel = parse_selector(empty)
        assert not sel
        assert str(sel) == ""
        assert sel(WEB)
        assert sel(None)
        assert sel(NONE)


def test_none_labels_are_treated_as_empty() -> None:
    assert parse_selector("!app")(None)
    assert not parse_selector("app")(None)


def test_selector_is_passed_through() -> None:
    sel = parse_selector("app=web")
    assert parse_selector(sel) is sel
    assert sel
    assert isinstance(sel, Selector)


def test_selector_is_immutable_and_hashable() -> None:
    sel = parse_selector("app=web")
    with pytest.raises(dataclasses.FrozenInstanceError):
        sel.requirements = ()  # type: ignore[misc]
    assert hash(sel) == hash(parse_selector("app==web"))
    assert sel == parse_selector("app==web")


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("app=web", "app=web"),
        ("app==web", "app=web"),
        ("app != web", "app!=web"),
        ("app in (web)", "app=web"),
        ("app notin (web)", "app!=web"),
        ("app in (web, db ,api)", "app in (api,db,web)"),
        ("app notin (b,a)", "app notin (a,b)"),
        ("app", "app"),
        ("! app", "!app"),
        ("b=1,a=2", "b=1,a=2"),  # string requirements keep their order
        ("app in (web,db),tier,!canary,env!=prod", "app in (db,web),tier,!canary,env!=prod"),
    ],
)
def test_canonical_str(text: str, canonical: str) -> None:
    assert str(parse_selector(text)) == canonical


@pytest.mark.parametrize(
    "text",
    [
        "app in (web,db),tier,!canary,env!=prod",
        "app notin (a,b)",
        "x=,y",
        "app.kubernetes.io/name=nginx",
    ],
)
def test_canonical_str_parses_back_to_the_same_selector(text: str) -> None:
    sel = parse_selector(text)
    assert parse_selector(str(sel)) == sel


@pytest.mark.parametrize(
    "text",
    [
        "app=web tier=db",  # missing comma
        "app in (web",  # unclosed set
        "app in web",  # set without parentheses
        "app=we b",
        "a=b,,c",  # empty term
        ",app",
        "=web",
        "app=(web)",
        "app >= 3",
    ],
)
def test_invalid_selector_raises_value_error(text: str) -> None:
    with pytest.raises(ValueError, match="invalid label selector"):
        parse_selector(text)
