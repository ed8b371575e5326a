"""declop.webhooks.patch: the JSON Patch a mutator's answer carries."""

from __future__ import annotations

import pytest

from declop.webhooks.patch import apply, diff, pointer


def test_equal_documents_give_no_operations():
    doc = {"metadata": {"name": "a", "labels": {"x": "1"}}, "spec": {"items": [1, 2, {"a": None}]}}
    assert diff(doc, {**doc}) == []
    assert diff(1, 1.0) == []


def test_added_replaced_and_removed_keys():
    old = {"spec": {"size": 1, "gone": True}, "metadata": {"name": "w"}}
    new = {"spec": {"size": 2, "color": "blue"}, "metadata": {"name": "w"}}
    assert diff(old, new) == [
        {"op": "remove", "path": "/spec/gone"},
        {"op": "replace", "path": "/spec/size", "value": 2},
        {"op": "add", "path": "/spec/color", "value": "blue"},
    ]


def test_keys_are_escaped_as_json_pointers():
    old = {"metadata": {"annotations": {}}}
    new = {"metadata": {"annotations": {"example.com/x~y": "1"}}}
    assert diff(old, new) == [{"op": "add", "path": "/metadata/annotations/example.com~1x~0y", "value": "1"}]
    assert pointer(["a/b", "c~d", 0]) == "/a~1b/c~0d/0"


def test_lists_element_wise_or_whole():
    assert diff({"l": [1, 2, 3]}, {"l": [1, 5, 3]}) == [{"op": "replace", "path": "/l/1", "value": 5}]
    assert diff({"l": [1, 2]}, {"l": [1, 2, 3]}) == [{"op": "replace", "path": "/l", "value": [1, 2, 3]}]


def test_json_types_not_python_ones():
    assert diff({"a": True}, {"a": 1}) == [{"op": "replace", "path": "/a", "value": 1}]
    assert diff({"a": 0}, {"a": False}) == [{"op": "replace", "path": "/a", "value": False}]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ({}, {"a": {"b": [1, {"c": "d"}]}}),
        ({"a": {"b": [1, {"c": "d"}]}}, {}),
        ({"a": [1, {"b": 2}], "c": "x"}, {"a": [1, {"b": 3, "e": None}], "c": None}),
        ({"a": "x"}, {"a": {"nested": ["y"]}}),
        ([1, 2], {"a": 1}),
    ],
)
def test_apply_of_diff_gives_the_new_document(old, new):
    assert apply(old, diff(old, new)) == new


def test_the_patch_holds_copies():
    new = {"spec": {"tags": ["a"]}}
    ops = diff({}, new)
    new["spec"]["tags"].append("b")
    assert ops[0]["value"] == {"tags": ["a"]}
