"""declop.kube.catalog: names read as ``declop run`` reads them, without a cluster — every
spelling of every standard resource, typed models with their scope, and one-line refusals.
(tests/integration/test_apiresources.py checks the standard table against a live apiserver.)"""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from declop.errors import ConfigError
from declop.kube.apiresources import RESOURCES
from declop.kube.catalog import Catalog, read_name, typed_resources
from declop.kube.discovery import ResourceInfo, resolve
from declop.kube.rbac import group_resource, is_cluster_scoped

STANDARD = Catalog.standard(models=False)


def spellings(r: ResourceInfo) -> list[str]:
    """Every name kubectl (and declop run) accepts for ``r``."""
    bare = [n for n in (r.plural, r.singular, r.kind, *r.short_names) if n]
    qualified = [f"{r.plural}.{r.group}", f"{r.plural}.{r.version}.{r.group}"] if r.group else [f"{r.plural}.{r.version}"]
    return bare + qualified


@given(st.sampled_from(RESOURCES).flatmap(lambda r: st.tuples(st.just(r), st.sampled_from(spellings(r)))),
       st.sampled_from([str, str.upper, str.title]))  # fmt: skip
def test_every_spelling_of_a_standard_resource_reads_as_discovery_resolves_it(case: tuple[ResourceInfo, str], cased: object) -> None:
    r, spelling = case
    name = cased(spelling)  # type: ignore[operator]
    try:
        expected = resolve(name, RESOURCES, watchable=False)
    except ConfigError:  # ambiguous across groups: both must refuse
        with pytest.raises(ConfigError):
            STANDARD.resolve(name)
        return
    assert STANDARD.resolve(name) == (expected.group, expected.plural)
    assert group_resource(name) == (expected.group, expected.plural)  # the lenient default agrees
    # it is the resource spelled, or the core one a bare name prefers (events: core wins)
    assert (expected.group, expected.plural) == (r.group, r.plural) or (expected.group == "" and "." not in name)
    assert STANDARD.cluster_scoped(expected.group, expected.plural) is not expected.namespaced


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Deployment", ("apps", "deployments")), ("deploy", ("apps", "deployments")), ("deployment.apps", ("apps", "deployments")),
        ("cj", ("batch", "cronjobs")), ("hpa", ("autoscaling", "horizontalpodautoscalers")),
        ("events", ("", "events")), ("events.events.k8s.io", ("events.k8s.io", "events")),
        ("tokenreviews", ("authentication.k8s.io", "tokenreviews")),  # create only: RBAC names it too
        ("crd", ("apiextensions.k8s.io", "customresourcedefinitions")),
        ("gizmos.example.com", ("example.com", "gizmos")), ("gizmos.v1.example.com", ("example.com", "gizmos")),
    ],
)  # fmt: skip
def test_names_resolve_to_group_and_plural(name: str, expected: tuple[str, str]) -> None:
    assert STANDARD.resolve(name) == expected


@pytest.mark.parametrize(
    ("name", "hint"),
    [("deploymnt", "'deployments.apps'"), ("deployments.v2.apps", "'deployments.apps'"), ("podz", "'pods'"), ("gizmos.apps", None)],
)
def test_a_name_of_kubernetes_own_groups_that_matches_nothing_is_refused(name: str, hint: str | None) -> None:
    with pytest.raises(ConfigError) as refused:
        STANDARD.resolve(name)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"unknown resource {name!r}: neither a standard Kubernetes")
    if hint:
        assert f"did you mean {hint}" in message
    assert STANDARD.lenient(name) == read_name(name)  # the default that must not raise reads the spelling


def test_a_typed_model_brings_its_names_and_scope() -> None:
    pytest.importorskip("pydantic")
    import declop

    class Tower(declop.CustomResource, group="catalog.example.com", version="v2", kind="Tower", scope="Cluster", short_names=["tw"]):
        pass

    class Flag(declop.CustomResource, group="catalog.example.com", version="v1", kind="Flag"):
        pass

    found = {(r.group, r.plural): r for r in typed_resources()}
    assert found[("catalog.example.com", "towers")].namespaced is False
    assert found[("catalog.example.com", "flags")].namespaced is True
    names = Catalog.standard()
    for spelling in ("Tower", "tw", "tower", "towers.catalog.example.com", "towers.v2.catalog.example.com"):
        assert names.resolve(spelling) == ("catalog.example.com", "towers")
    assert names.cluster_scoped("catalog.example.com", "towers/status")
    assert not names.cluster_scoped("catalog.example.com", "flags")
    # the apiserver's word wins over a model's
    served = ResourceInfo("catalog.example.com", "v2", "towers", "Tower", namespaced=True)
    assert not Catalog.served([served], source="test").cluster_scoped("catalog.example.com", "towers")


def test_the_standard_scopes_replace_the_old_hand_list() -> None:
    for group, plural in [("", "nodes"), ("", "namespaces"), ("storage.k8s.io", "storageclasses"),
                          ("rbac.authorization.k8s.io", "clusterroles"), ("apiextensions.k8s.io", "customresourcedefinitions")]:  # fmt: skip
        assert is_cluster_scoped(group, plural)
    assert not is_cluster_scoped("", "pods") and not is_cluster_scoped("apps", "deployments/status")
