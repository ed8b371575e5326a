"""declop.kube.resource: field selector syntax and the Resource value."""

from __future__ import annotations

import dataclasses

import pytest

from declop.errors import RegistrationError
from declop.kube.resource import Resource, parse_fields


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        (None, ""),
        ("", ""),
        ("spec.nodeName=node-1", "spec.nodeName=node-1"),
        ("spec.nodeName==node-1", "spec.nodeName=node-1"),
        (" status.phase != Running , metadata.name=a ", "metadata.name=a,status.phase!=Running"),
        ({"spec.nodeName": "n1", "metadata.name": "a"}, "metadata.name=a,spec.nodeName=n1"),
        ("metadata.name=", "metadata.name="),  # an empty value is valid: selects objects without it
    ],
)
def test_parse_fields_gives_one_canonical_form(given: object, canonical: str) -> None:
    assert parse_fields(given) == canonical  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["spec.nodeName", "=x", "spec node=x", "a=b,c"])
def test_parse_fields_refuses_a_malformed_term_with_the_syntax(bad: str) -> None:
    with pytest.raises(RegistrationError, match="is not a valid field selector term; write 'spec.nodeName=node-1'"):
        parse_fields(bad)


def test_equal_selections_compare_equal_and_are_frozen() -> None:
    a = Resource(" pods ", fields="spec.nodeName==n1")
    b = Resource("pods", fields={"spec.nodeName": "n1"})
    assert a == b and hash(a) == hash(b)
    assert a.name == "pods"
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.name = "x"  # type: ignore[misc]


def test_str_names_the_options() -> None:
    assert str(Resource("pods")) == "pods"
    assert str(Resource("secrets", metadata_only=True, fields="type=Opaque")) == "secrets (metadata only, fields type=Opaque)"


def test_of_accepts_names_and_resources_only() -> None:
    r = Resource("secrets", metadata_only=True)
    assert Resource.of(r) is r
    assert Resource.of("configmaps") == Resource("configmaps")
    with pytest.raises(RegistrationError, match="owns= entries are resource names"):
        Resource.of(("configmaps",), what="owns=")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": ""}, "resource must be a name like 'pods'"),
        ({"name": "pods", "metadata_only": 1}, "metadata_only must be True or False, got 1"),
    ],
)
def test_bad_values_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(RegistrationError, match=message):
        Resource(**kwargs)  # type: ignore[arg-type]


# -- a typed model where a name goes (issue 26) ---------------------------------------------------


def test_a_model_is_its_resource_name_and_anything_else_passes_through() -> None:
    from declop.kube.resource import resource_name
    from declop.typed.model import CustomResource

    class Knob(CustomResource, group="example.com", version="v2", kind="Knob", plural="knobz"):
        pass

    assert resource_name(Knob) == "knobz.v2.example.com"
    assert Resource.of(Knob) == Resource("knobz.v2.example.com")
    assert resource_name("pods") == "pods" and resource_name(Resource("pods")) == Resource("pods")


def test_a_class_that_is_no_model_is_one_line() -> None:
    from declop.kube.resource import resource_name

    with pytest.raises(RegistrationError, match=r"^owns=: set is a class, not a resource; pass a resource name like 'pods' or a declop.CustomResource subclass$"):
        resource_name(set, what="owns=")
