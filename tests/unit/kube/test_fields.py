"""declop.kube.fields: field selectors evaluated on cached objects as the apiserver would."""

from __future__ import annotations

import pytest

from declop.kube.fields import parse_fields

POD = {
    "metadata": {"name": "p", "namespace": "ns", "labels": {"a": "b"}},
    "spec": {"nodeName": "n1", "hostNetwork": True, "priority": 10},
    "status": {"phase": "Running"},
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", True),
        ("metadata.name=p", True),
        ("metadata.name==p", True),
        ("metadata.name!=p", False),
        ("metadata.name=p,status.phase=Running", True),
        ("metadata.name=p,status.phase=Pending", False),
        ("spec.nodeName=", False),
        ("spec.missing=", True),  # a missing field is the empty string
        ("spec.missing!=x", True),
        ("spec.hostNetwork=true", True),
        ("spec.priority=10", True),
        ("metadata.labels=", True),  # not a scalar
        (" status.phase = Running ", True),
    ],
)
def test_terms(text: str, expected: bool) -> None:
    assert parse_fields(text)(POD) is expected


def test_escaped_commas_and_equals_belong_to_the_value() -> None:
    obj = {"metadata": {"name": "a,b=c"}}
    assert parse_fields(r"metadata.name=a\,b\=c")(obj)
    assert not parse_fields(r"metadata.name=a\,b\=d")(obj)


def test_the_empty_selector_is_falsy_and_matches_everything() -> None:
    assert not parse_fields(None) and parse_fields(None)({})


@pytest.mark.parametrize("text", ["metadata.name", "=x", "metadata.name<3"])
def test_a_malformed_term_is_named(text: str) -> None:
    with pytest.raises(ValueError, match="invalid field selector"):
        parse_fields(text)
