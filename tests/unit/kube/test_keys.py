"""declop.kube.keys: Request is a frozen namespace/name pair with a str()/parse round trip."""

from __future__ import annotations


import pytest

from declop.kube.keys import Request, key_of


@pytest.mark.parametrize(
    ("request_", "text"),
    [
        (Request("default", "nginx"), "default/nginx"),
        (
            Request("kube-system", "coredns-5d78c9869d-abcde"),
            "kube-system/coredns-5d78c9869d-abcde",
        ),
        (Request("", "node-1"), "node-1"),
        (Request("", "widgets.example.com"), "widgets.example.com"),
    ],
)
def test_str_and_parse_round_trip(request_: Request, text: str) -> None:
    assert str(request_) == text
    assert Request.parse(text) == request_
    assert Request.parse(str(request_)) == request_


def test_cluster_scoped_has_empty_namespace() -> None:
    req = Request.parse("node-1")
    assert req.namespace == ""
    assert req.name == "node-1"
    assert str(req) == "node-1"


@pytest.mark.parametrize("text", ["ns/", "a/b/c", "ns/name/", "/"])
def test_parse_rejects_invalid_keys(text: str) -> None:
    with pytest.raises(ValueError, match="not a key"):
        Request.parse(text)


def test_parse_rejects_the_empty_string() -> None:
    """``""`` is neither ``'namespace/name'`` nor ``'name'``; it must not become ``Request("", "")``."""
    with pytest.raises(ValueError, match="not a key"):
        Request.parse("")


def test_request_is_frozen_hashable_and_ordered() -> None:
    req = Request("ns", "a")
    with pytest.raises(AttributeError):
        req.name = "b"  # type: ignore[misc]
    assert {req, Request("ns", "a")} == {req}
    assert sorted([Request("ns", "b"), Request("", "z"), Request("ns", "a")]) == [
        Request("", "z"),
        Request("ns", "a"),
        Request("ns", "b"),
    ]


def test_key_of_namespaced_object() -> None:
    obj = {"metadata": {"namespace": "default", "name": "nginx", "labels": {"a": "b"}}}
    assert key_of(obj) == Request("default", "nginx")


@pytest.mark.parametrize(
    "meta",
    [
        {"name": "node-1"},
        {"name": "node-1", "namespace": None},
        {"name": "node-1", "namespace": ""},
    ],
)
def test_key_of_cluster_scoped_object(meta: dict[str, object]) -> None:
    assert key_of({"metadata": meta}) == Request("", "node-1")


def test_key_of_requires_metadata_name() -> None:
    with pytest.raises(KeyError):
        key_of({"metadata": {"namespace": "default"}})
