"""declop.typed.crd: the CRDs of a set of models — versions, names, subresources, columns,
conversion — and their YAML, the same bytes every time."""

from __future__ import annotations

import types
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, Field

from declop.errors import RegistrationError
from declop.typed.crd import crd_name_of, definitions, dump, models_in
from declop.typed.model import Column, CustomResource


class GizmoSpec(BaseModel):
    size: int = Field(1, ge=1)


class GizmoSpecV1(BaseModel):
    size: int = Field(1, ge=1)
    color: str = "red"


class GizmoV1(
    CustomResource,
    group="toys.example.com",
    version="v1",
    kind="Gizmo",
    scope="Cluster",
    short_names=("gz",),
    categories=("toys",),
    printer_columns=(Column("Size", ".spec.size", type="integer", description="How big"), Column("Age", ".metadata.creationTimestamp", type="date", priority=1)),
):
    spec: GizmoSpecV1
    status: dict[str, str] | None = None


class GizmoV1beta1(CustomResource, group="toys.example.com", version="v1beta1", kind="Gizmo", scope="Cluster", storage=False):
    spec: GizmoSpec


class GizmoV1alpha1(CustomResource, group="toys.example.com", version="v1alpha1", kind="Gizmo", scope="Cluster", storage=False, served=False):
    spec: GizmoSpec


class Plain(CustomResource, group="example.com", version="v1", kind="Plain", status=False):
    spec: GizmoSpec


def only(crds: list[dict[str, Any]]) -> dict[str, Any]:
    (crd,) = crds
    return crd


def test_one_crd_per_kind_with_its_versions_in_kubernetes_priority_order() -> None:
    crds = definitions([GizmoV1alpha1, Plain, GizmoV1, GizmoV1beta1])
    assert [c["metadata"]["name"] for c in crds] == ["gizmos.toys.example.com", "plains.example.com"]  # by name
    gizmo = crds[0]
    assert (gizmo["apiVersion"], gizmo["kind"]) == ("apiextensions.k8s.io/v1", "CustomResourceDefinition")
    versions = gizmo["spec"]["versions"]
    assert [(v["name"], v["served"], v["storage"]) for v in versions] == [
        ("v1", True, True), ("v1beta1", True, False), ("v1alpha1", False, False),
    ]
    assert versions[0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["color"] == {"type": "string", "default": "red"}
    assert "color" not in versions[1]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]


def test_names_scope_short_names_and_categories() -> None:
    spec = definitions([GizmoV1, GizmoV1beta1])[0]["spec"]
    assert spec["group"] == "toys.example.com" and spec["scope"] == "Cluster"
    assert spec["names"] == {
        "kind": "Gizmo", "listKind": "GizmoList", "plural": "gizmos", "singular": "gizmo",
        "shortNames": ["gz"], "categories": ["toys"],
    }  # given on v1 only: the kind's


def test_status_subresource_and_printer_columns() -> None:
    v1, v1beta1 = definitions([GizmoV1, GizmoV1beta1])[0]["spec"]["versions"]
    assert v1["subresources"] == {"status": {}}  # a status field: on by default
    assert "subresources" not in v1beta1 and "subresources" not in only(definitions([Plain]))["spec"]["versions"][0]
    assert v1["additionalPrinterColumns"] == [
        {"name": "Size", "type": "integer", "jsonPath": ".spec.size", "description": "How big"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp", "priority": 1},
    ]


def test_no_conversion_unless_given_and_then_a_webhook_without_ca_bundle() -> None:
    assert "conversion" not in definitions([GizmoV1, GizmoV1beta1])[0]["spec"]
    config = {"caBundle": "", "service": {"namespace": "ops", "name": "gizmo", "port": 443, "path": "/convert/c.gizmos.toys.example.com"}}
    spec = definitions([GizmoV1, GizmoV1beta1], conversions={"gizmos.toys.example.com": config})[0]["spec"]
    assert spec["conversion"] == {
        "strategy": "Webhook",
        "webhook": {"conversionReviewVersions": ["v1"], "clientConfig": {"service": config["service"]}},
    }
    with pytest.raises(RegistrationError, match="conversion webhook is set for widgets.example.com, which no model defines"):
        definitions([GizmoV1], conversions={"widgets.example.com": config})


def test_exactly_one_storage_version() -> None:
    class GizmoV2(CustomResource, group="toys.example.com", version="v2", kind="Gizmo", scope="Cluster"):
        spec: GizmoSpec

    with pytest.raises(RegistrationError) as two:
        definitions([GizmoV1, GizmoV2])
    assert str(two.value) == (
        "gizmos.toys.example.com: versions v2 and v1 all say storage=True; exactly one version is stored in etcd: "
        "pass storage=False to the others (class keyword)"
    )
    with pytest.raises(RegistrationError, match="none of the versions v1beta1, v1alpha1 says storage=True"):
        definitions([GizmoV1beta1, GizmoV1alpha1])


def test_one_class_per_version_and_the_names_agree() -> None:
    class Again(CustomResource, group="toys.example.com", version="v1", kind="Gizmo", scope="Cluster", storage=False):
        spec: GizmoSpec

    class Namespaced(CustomResource, group="toys.example.com", version="v2", kind="Gizmo", storage=False):
        spec: GizmoSpec

    class OtherShort(CustomResource, group="toys.example.com", version="v2", kind="Gizmo", scope="Cluster", storage=False, short_names=("gzm",)):
        spec: GizmoSpec

    with pytest.raises(RegistrationError, match="GizmoV1 and .*Again both define version v1; one class per version"):
        definitions([GizmoV1, Again])
    with pytest.raises(RegistrationError, match=r"Namespaced \(v2\) and GizmoV1 \(v1\) give different scope \('Namespaced', 'Cluster'\)"):
        definitions([GizmoV1, Namespaced])
    with pytest.raises(RegistrationError, match="the versions give different short_names"):
        definitions([GizmoV1, OtherShort])


def test_every_version_may_not_be_unserved() -> None:
    class Hidden(CustomResource, group="example.com", version="v1", kind="Hidden", served=False):
        spec: GizmoSpec

    with pytest.raises(RegistrationError, match="no version is served"):
        definitions([Hidden])


def test_dump_is_yaml_documents_that_read_back_the_same_with_no_anchors() -> None:
    crds = definitions([GizmoV1, GizmoV1beta1, Plain])
    text = dump(crds)
    assert text.startswith("---\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n")
    assert text.count("\n---\n") == 1 and "&id" not in text and "*id" not in text
    assert list(yaml.safe_load_all(text)) == crds
    assert dump(definitions([Plain, GizmoV1beta1, GizmoV1])) == text  # the order models come in does not matter


def test_models_in_modules_and_registrations() -> None:
    module = types.ModuleType("handlers")
    module.GizmoV1 = GizmoV1  # type: ignore[attr-defined]
    module.Base = CustomResource  # type: ignore[attr-defined]  # no kind: not a model of a CRD
    module.spec = GizmoSpec  # type: ignore[attr-defined]

    class Registration:
        def __init__(self, resource: object) -> None:
            self.resource = resource

    assert models_in([module], Registration(Plain), Registration("pods"), GizmoV1beta1) == [GizmoV1, Plain, GizmoV1beta1]


def test_crd_name_of_a_decorators_resource() -> None:
    models = [GizmoV1, GizmoV1beta1, Plain]
    for resource in ("gizmos.toys.example.com", "gizmos.v1beta1.toys.example.com", "gizmos", "Gizmo", "gz", GizmoV1beta1):
        assert crd_name_of(resource, models) == "gizmos.toys.example.com", resource
    assert crd_name_of("widgets.example.com", models) is None
