"""Tests for declop.kube.discovery: parsing, kubectl-style resolution, paths, and Discovery I/O."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from declop.kube.discovery import (
    AGGREGATED_ACCEPT,
    Discovery,
    ResourceInfo,
    parse_aggregated,
    parse_legacy_group_versions,
    parse_resource_list,
    resolve,
    suggest,
)
from declop.errors import ApiError, ConfigError, NotFound

ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


# --------------------------------------------------------------------------- fixtures


def _res(
    plural: str,
    kind: str,
    *,
    scope: str = "Namespaced",
    singular: str | None = None,
    short: list[str] | None = None,
    verbs: list[str] | None = None,
    subs: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One APIResourceDiscovery as the apiserver writes it (responseKind group/version blank)."""
    doc: dict[str, Any] = {
        "resource": plural,
        "responseKind": {"group": "", "version": "", "kind": kind},
        "scope": scope,
        "singularResource": kind.lower() if singular is None else singular,
        "verbs": ALL_VERBS if verbs is None else verbs,
    }
    if short:
        doc["shortNames"] = short
    if subs:
        doc["subresources"] = [
            {
                "subresource": sub,
                "responseKind": {"group": "", "version": "", "kind": kind},
                "verbs": ["get", "patch", "update"],
            }
            for sub in subs
        ]
    return doc


def _group(name: str | None, *versions: tuple[str, list[dict[str, Any]]]) -> dict[str, Any]:
    metadata: dict[str, Any] = {"creationTimestamp": None}
    if name is not None:
        metadata["name"] = name
    return {
        "metadata": metadata,
        "versions": [
            {"version": v, "resources": resources, "freshness": "Current"}
            for v, resources in versions
        ],
    }


def _discovery_list(*items: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": list(items),
    }


def api_doc() -> dict[str, Any]:
    """``GET /api`` (aggregated): the core group, whose metadata has no name."""
    return _discovery_list(
        _group(
            None,
            (
                "v1",
                [
                    _res("bindings", "Binding", verbs=["create"]),
                    _res("configmaps", "ConfigMap", short=["cm"]),
                    _res("events", "Event", short=["ev"]),
                    _res("namespaces", "Namespace", scope="Cluster", short=["ns"],
                         verbs=["create", "delete", "get", "list", "patch", "update", "watch"],
                         subs=("finalize", "status")),
                    _res("pods", "Pod", short=["po"],
                         subs=("attach", "binding", "eviction", "exec", "log", "status")),
                ],
            ),
        )
    )


def apis_doc(*, with_crd: bool = True) -> dict[str, Any]:
    """``GET /apis`` (aggregated): apps, events, metrics, a CRD group and two 'things' groups."""
    groups = [
        _group(
            "apps",
            ("v1", [_res("deployments", "Deployment", short=["deploy"], subs=("scale", "status"))]),
        ),
        _group("events.k8s.io", ("v1", [_res("events", "Event", short=["ev"])])),
        _group(
            "metrics.k8s.io",
            (
                "v1beta1",
                [
                    _res("nodes", "NodeMetrics", scope="Cluster", verbs=["get", "list"]),
                    _res("pods", "PodMetrics", verbs=["get", "list"]),
                ],
            ),
        ),
    ]
    if with_crd:
        groups.append(
            _group(
                "example.com",
                ("v1", [_res("widgets", "Widget", short=["wd"], subs=("status",))]),
                (
                    "v1beta1",
                    [
                        _res("widgets", "Widget", short=["wd"], subs=("status",)),
                        _res("gadgets", "Gadget", scope="Cluster"),
                    ],
                ),
            )
        )
    groups += [
        _group("a.example.com", ("v1", [_res("things", "Thing")])),
        _group("b.example.com", ("v1", [_res("things", "Thing")])),
    ]
    return _discovery_list(*groups)


@pytest.fixture
def resources() -> list[ResourceInfo]:
    return parse_aggregated(api_doc()) + parse_aggregated(apis_doc())


def _find(resources: list[ResourceInfo], group: str, version: str, plural: str) -> ResourceInfo:
    (found,) = [
        r for r in resources if (r.group, r.version, r.plural) == (group, version, plural)
    ]
    return found


# --------------------------------------------------------------------------- ResourceInfo

POD = ResourceInfo("", "v1", "pods", "Pod", True, "pod", ("po",), tuple(ALL_VERBS),
                   ("log", "status"))
NS = ResourceInfo("", "v1", "namespaces", "Namespace", False, "namespace", ("ns",))
DEPLOY = ResourceInfo("apps", "v1", "deployments", "Deployment", True, "deployment",
                      subresources=("scale", "status"))
NODE_METRICS = ResourceInfo("metrics.k8s.io", "v1beta1", "nodes", "NodeMetrics", False)


def test_api_version_and_group_resource() -> None:
    assert (POD.api_version, POD.group_resource, str(POD)) == ("v1", "pods", "pods")
    assert (DEPLOY.api_version, DEPLOY.group_resource, str(DEPLOY)) == (
        "apps/v1",
        "deployments.apps",
        "deployments.apps",
    )


@pytest.mark.parametrize(
    ("info", "kwargs", "expected"),
    [
        (POD, {}, "/api/v1/pods"),
        (POD, {"namespace": ""}, "/api/v1/pods"),
        (POD, {"namespace": "default"}, "/api/v1/namespaces/default/pods"),
        (POD, {"namespace": "default", "name": "web"}, "/api/v1/namespaces/default/pods/web"),
        (POD, {"namespace": "default", "name": "web", "subresource": "status"},
         "/api/v1/namespaces/default/pods/web/status"),
        (NS, {}, "/api/v1/namespaces"),
        (NS, {"name": "kube-system"}, "/api/v1/namespaces/kube-system"),
        (NS, {"namespace": "ignored", "name": "kube-system"}, "/api/v1/namespaces/kube-system"),
        (NS, {"name": "x", "subresource": "finalize"}, "/api/v1/namespaces/x/finalize"),
        (DEPLOY, {}, "/apis/apps/v1/deployments"),
        (DEPLOY, {"namespace": "prod"}, "/apis/apps/v1/namespaces/prod/deployments"),
        (DEPLOY, {"namespace": "prod", "name": "api", "subresource": "scale"},
         "/apis/apps/v1/namespaces/prod/deployments/api/scale"),
        (NODE_METRICS, {"namespace": "ignored"}, "/apis/metrics.k8s.io/v1beta1/nodes"),
        (NODE_METRICS, {"name": "n1"}, "/apis/metrics.k8s.io/v1beta1/nodes/n1"),
    ],
)
def test_path(info: ResourceInfo, kwargs: dict[str, str], expected: str) -> None:
    assert info.path(**kwargs) == expected


def test_path_rejects_meaningless_combinations() -> None:
    with pytest.raises(ValueError, match="namespaced"):
        POD.path(name="web")
    with pytest.raises(ValueError, match="needs an object name"):
        POD.path(namespace="default", subresource="status")
    with pytest.raises(ValueError, match="no subresource 'scale'"):
        POD.path(namespace="default", name="web", subresource="scale")


def test_path_accepts_any_subresource_when_none_are_known() -> None:
    bare = ResourceInfo("", "v1", "pods", "Pod", True)
    assert bare.path("ns", "p", "whatever") == "/api/v1/namespaces/ns/pods/p/whatever"


def test_resource_info_is_frozen_and_hashable() -> None:
    with pytest.raises(AttributeError):
        POD.plural = "x"  # type: ignore[misc]
    assert len({POD, copy.copy(POD)}) == 1


# --------------------------------------------------------------------------- parse_aggregated


def test_parse_aggregated_core(resources: list[ResourceInfo]) -> None:
    core = parse_aggregated(api_doc())
    assert [r.plural for r in core] == ["bindings", "configmaps", "events", "namespaces", "pods"]
    pods = core[-1]
    assert pods == ResourceInfo(
        group="",
        version="v1",
        plural="pods",
        kind="Pod",
        namespaced=True,
        singular="pod",
        short_names=("po",),
        verbs=tuple(ALL_VERBS),
        subresources=("attach", "binding", "eviction", "exec", "log", "status"),
    )
    namespaces = core[3]
    assert namespaces.namespaced is False
    assert namespaces.subresources == ("finalize", "status")


def test_parse_aggregated_core_with_empty_group_name() -> None:
    doc = _discovery_list(_group("", ("v1", [_res("pods", "Pod")])))
    assert [(r.group, r.version, r.plural) for r in parse_aggregated(doc)] == [("", "v1", "pods")]


def test_parse_aggregated_groups_keep_server_order_preferred_version_first(
    resources: list[ResourceInfo],
) -> None:
    groups = parse_aggregated(apis_doc())
    assert [(r.group, r.version, r.plural) for r in groups] == [
        ("apps", "v1", "deployments"),
        ("events.k8s.io", "v1", "events"),
        ("metrics.k8s.io", "v1beta1", "nodes"),
        ("metrics.k8s.io", "v1beta1", "pods"),
        ("example.com", "v1", "widgets"),
        ("example.com", "v1beta1", "widgets"),
        ("example.com", "v1beta1", "gadgets"),
        ("a.example.com", "v1", "things"),
        ("b.example.com", "v1", "things"),
    ]
    deploy = groups[0]
    assert (deploy.kind, deploy.singular, deploy.short_names) == ("Deployment", "deployment",
                                                                  ("deploy",))
    assert deploy.subresources == ("scale", "status")
    assert _find(groups, "example.com", "v1beta1", "gadgets").namespaced is False


def test_parse_aggregated_tolerates_missing_optional_fields() -> None:
    doc = _discovery_list(
        {
            "metadata": {"name": "x.io"},
            "versions": [
                {"version": "v1", "freshness": "Stale"},
                {"version": "v1alpha1", "resources": [{"resource": "bare", "scope": "Cluster"}]},
            ],
        },
        {"metadata": {"name": "empty.io"}},
    )
    assert parse_aggregated(doc) == [ResourceInfo("x.io", "v1alpha1", "bare", "", False)]


def test_parse_aggregated_rejects_other_documents() -> None:
    with pytest.raises(ValueError, match="APIGroupDiscoveryList"):
        parse_aggregated({"kind": "APIGroupList", "groups": []})


# --------------------------------------------------------------------------- legacy parsing

LEGACY_API = {
    "kind": "APIVersions",
    "versions": ["v1"],
    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "x:6443"}],
}
LEGACY_APIS = {
    "kind": "APIGroupList",
    "apiVersion": "v1",
    "groups": [
        {
            "name": "apps",
            "versions": [{"groupVersion": "apps/v1", "version": "v1"}],
            "preferredVersion": {"groupVersion": "apps/v1", "version": "v1"},
        },
        {
            "name": "example.com",
            "versions": [
                {"groupVersion": "example.com/v1beta1", "version": "v1beta1"},
                {"groupVersion": "example.com/v1", "version": "v1"},
            ],
            "preferredVersion": {"groupVersion": "example.com/v1", "version": "v1"},
        },
        {
            "name": "metrics.k8s.io",
            "versions": [{"groupVersion": "metrics.k8s.io/v1beta1", "version": "v1beta1"}],
            "preferredVersion": {"groupVersion": "metrics.k8s.io/v1beta1", "version": "v1beta1"},
        },
    ],
}
LEGACY_CORE_V1 = {
    "kind": "APIResourceList",
    "groupVersion": "v1",
    "resources": [
        {"name": "namespaces", "singularName": "namespace", "namespaced": False,
         "kind": "Namespace", "verbs": ALL_VERBS, "shortNames": ["ns"]},
        {"name": "namespaces/status", "singularName": "", "namespaced": False,
         "kind": "Namespace", "verbs": ["get", "patch", "update"]},
        {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod",
         "verbs": ALL_VERBS, "shortNames": ["po"], "categories": ["all"]},
        {"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod",
         "verbs": ["get"]},
        {"name": "pods/status", "singularName": "", "namespaced": True, "kind": "Pod",
         "verbs": ["get", "patch", "update"]},
    ],
}
LEGACY_APPS_V1 = {
    "kind": "APIResourceList",
    "apiVersion": "v1",
    "groupVersion": "apps/v1",
    "resources": [
        {"name": "deployments", "singularName": "deployment", "namespaced": True,
         "kind": "Deployment", "verbs": ALL_VERBS, "shortNames": ["deploy"]},
        {"name": "deployments/scale", "singularName": "", "namespaced": True,
         "group": "autoscaling", "version": "v1", "kind": "Scale",
         "verbs": ["get", "patch", "update"]},
        {"name": "deployments/status", "singularName": "", "namespaced": True,
         "kind": "Deployment", "verbs": ["get", "patch", "update"]},
    ],
}
LEGACY_EXAMPLE_V1 = {
    "kind": "APIResourceList",
    "groupVersion": "example.com/v1",
    "resources": [{"name": "widgets", "singularName": "widget", "namespaced": True,
                   "kind": "Widget", "verbs": ALL_VERBS}],
}
LEGACY_EXAMPLE_V1BETA1 = {
    "kind": "APIResourceList",
    "groupVersion": "example.com/v1beta1",
    "resources": [{"name": "widgets", "singularName": "", "namespaced": True,
                   "kind": "Widget", "verbs": ALL_VERBS}],
}


def test_parse_legacy_group_versions_core() -> None:
    assert parse_legacy_group_versions(LEGACY_API) == [("", "v1")]


def test_parse_legacy_group_versions_puts_preferred_version_first() -> None:
    assert parse_legacy_group_versions(LEGACY_APIS) == [
        ("apps", "v1"),
        ("example.com", "v1"),
        ("example.com", "v1beta1"),
        ("metrics.k8s.io", "v1beta1"),
    ]


def test_parse_legacy_group_versions_rejects_other_documents() -> None:
    with pytest.raises(ValueError, match="APIGroupList"):
        parse_legacy_group_versions({"kind": "APIResourceList"})


def test_parse_resource_list_folds_subresources_into_parents() -> None:
    core = parse_resource_list(LEGACY_CORE_V1)
    assert core == [
        ResourceInfo("", "v1", "namespaces", "Namespace", False, "namespace", ("ns",),
                     tuple(ALL_VERBS), ("status",)),
        ResourceInfo("", "v1", "pods", "Pod", True, "pod", ("po",), tuple(ALL_VERBS),
                     ("log", "status")),
    ]
    (deploy,) = parse_resource_list(LEGACY_APPS_V1)
    assert (deploy.group, deploy.version, deploy.api_version) == ("apps", "v1", "apps/v1")
    assert deploy.subresources == ("scale", "status")


# --------------------------------------------------------------------------- resolve


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("pods", ("", "v1", "pods")),
        ("pod", ("", "v1", "pods")),
        ("po", ("", "v1", "pods")),
        ("Pod", ("", "v1", "pods")),
        ("PODS", ("", "v1", "pods")),
        ("  pods ", ("", "v1", "pods")),
        ("cm", ("", "v1", "configmaps")),
        ("ConfigMap", ("", "v1", "configmaps")),
        ("ns", ("", "v1", "namespaces")),
        ("deploy", ("apps", "v1", "deployments")),
        ("Deployment", ("apps", "v1", "deployments")),
        ("deployments.apps", ("apps", "v1", "deployments")),
        ("deployment.apps", ("apps", "v1", "deployments")),
        ("deploy.apps", ("apps", "v1", "deployments")),
        ("deployments.v1.apps", ("apps", "v1", "deployments")),
        ("widgets", ("example.com", "v1", "widgets")),
        ("wd", ("example.com", "v1", "widgets")),
        ("Widget", ("example.com", "v1", "widgets")),
        ("widgets.example.com", ("example.com", "v1", "widgets")),
        ("widgets.v1.example.com", ("example.com", "v1", "widgets")),
        ("widgets.v1beta1.example.com", ("example.com", "v1beta1", "widgets")),
        ("Widget.V1Beta1.Example.COM", ("example.com", "v1beta1", "widgets")),
        ("gadgets", ("example.com", "v1beta1", "gadgets")),
        ("pods.v1", ("", "v1", "pods")),
        ("events", ("", "v1", "events")),
        ("ev", ("", "v1", "events")),
        ("Event", ("", "v1", "events")),
        ("events.events.k8s.io", ("events.k8s.io", "v1", "events")),
        ("events.v1.events.k8s.io", ("events.k8s.io", "v1", "events")),
        ("things.a.example.com", ("a.example.com", "v1", "things")),
        ("things.v1.b.example.com", ("b.example.com", "v1", "things")),
    ],
)
def test_resolve(resources: list[ResourceInfo], name: str, expected: tuple[str, str, str]) -> None:
    found = resolve(name, resources)
    assert (found.group, found.version, found.plural) == expected


def test_pods_means_core_even_if_metrics_pods_were_watchable(
    resources: list[ResourceInfo],
) -> None:
    watchable_metrics = [
        ResourceInfo(r.group, r.version, r.plural, r.kind, r.namespaced, r.singular,
                     r.short_names, tuple(ALL_VERBS), r.subresources)
        if r.group == "metrics.k8s.io" else r
        for r in resources
    ]
    assert resolve("pods", watchable_metrics).group == ""
    assert resolve("pods.metrics.k8s.io", watchable_metrics).group == "metrics.k8s.io"


def test_core_wins_regardless_of_order() -> None:
    ev_new = ResourceInfo("events.k8s.io", "v1", "events", "Event", True)
    ev_core = ResourceInfo("", "v1", "events", "Event", True)
    assert resolve("events", [ev_new, ev_core]) is ev_core


def test_version_group_reading_falls_back_to_group_reading() -> None:
    # a group whose first label looks like a version
    odd = ResourceInfo("v1.odd.io", "v2", "things", "Thing", True)
    assert resolve("things.v1.odd.io", [odd]) is odd


def test_preferred_version_breaks_ties_between_groups() -> None:
    # x.io serves things only in its older version; y.io in its preferred one
    resources = [
        ResourceInfo("x.io", "v2", "others", "Other", True),
        ResourceInfo("x.io", "v1", "things", "Thing", True),
        ResourceInfo("y.io", "v1", "things", "Thing", True),
    ]
    assert resolve("things", resources).group == "y.io"


def test_verbs_unknown_counts_as_watchable() -> None:
    bare = ResourceInfo("x.io", "v1", "things", "Thing", True)
    assert resolve("things", [bare]) is bare


def test_ambiguous_across_groups(resources: list[ResourceInfo]) -> None:
    with pytest.raises(ConfigError) as err:
        resolve("things", resources)
    message = str(err.value)
    assert "\n" not in message
    assert "ambiguous resource 'things'" in message
    assert "things.a.example.com, things.b.example.com" in message
    assert "qualify" in message


@pytest.mark.parametrize("name", ["foo", "foos.apps", ".apps", ""])
def test_unknown(resources: list[ResourceInfo], name: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve(name, resources)
    message = str(err.value)
    assert message == (
        f"unknown resource {name!r}: not served by the apiserver; "
        "check the name with 'kubectl api-resources'"
    )


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("deploymnets", "'deployments.apps'"),  # a bare name is compared with plural, singular, kind, short names
        ("Deploymnet", "'deployments.apps'"),
        ("pdos", "'pods'"),
        ("cofigmaps", "'configmaps'"),
        ("gadgts", "'gadgets.example.com'"),
        ("widgts.example.com", "'widgets.example.com'"),  # a dotted one with plural.group
        ("widgets.exmaple.com", "'widgets.example.com'"),
        ("widgets.v2.example.com", "'widgets.example.com'"),  # … and plural.version.group
        ("deployments.extensions", "'deployments.apps'"),
        ("things.example.com", "'things.a.example.com' or 'things.b.example.com'"),
    ],
)
def test_unknown_suggests_the_closest_served_resources(
    resources: list[ResourceInfo], name: str, meant: str
) -> None:
    with pytest.raises(ConfigError) as err:
        resolve(name, resources)
    assert str(err.value) == (
        f"unknown resource {name!r}: not served by the apiserver; did you mean {meant}? "
        "(or check the name with 'kubectl api-resources')"
    )
    assert suggest(name, resources) == f"did you mean {meant}?"


def test_suggestions_are_only_listable_and_watchable_resources(resources: list[ResourceInfo]) -> None:
    assert "bindings" not in (suggest("bindngs", resources) or "")  # bindings: create only
    assert "metrics" not in (suggest("nodes.metrics.k8s.oi", resources) or "")  # get/list only


def test_not_watchable(resources: list[ResourceInfo]) -> None:
    with pytest.raises(ConfigError, match=r"cannot be listed and watched: pods.metrics.k8s.io"):
        resolve("pods.metrics.k8s.io", resources)
    with pytest.raises(ConfigError, match=r"'bindings' cannot be listed and watched: bindings "
                                          r"\(create\)"):
        resolve("bindings", resources)


def test_ambiguity_within_one_group() -> None:
    resources = [
        ResourceInfo("x.io", "v1", "alphas", "Alpha", True, short_names=("thing",)),
        ResourceInfo("x.io", "v1", "betas", "Beta", True, short_names=("thing",)),
    ]
    with pytest.raises(ConfigError, match="alphas.x.io, betas.x.io"):
        resolve("thing", resources)


# --------------------------------------------------------------------------- Discovery


class FakeApi:
    """A get_json double: serves ``docs`` by path, raises ``errors`` by path, records calls."""

    def __init__(self, docs: dict[str, Any], errors: dict[str, Exception] | None = None) -> None:
        self.docs = docs
        self.errors = errors or {}
        self.calls: list[tuple[str, str]] = []

    async def __call__(self, path: str, accept: str) -> Any:
        self.calls.append((path, accept))
        await asyncio.sleep(0)
        if path in self.errors:
            raise self.errors[path]
        if path not in self.docs:
            raise NotFound(f"{path} not found")
        return copy.deepcopy(self.docs[path])

    def paths(self) -> list[str]:
        return [path for path, _ in self.calls]


def test_refresh_uses_aggregated_discovery() -> None:
    api = FakeApi({"/api": api_doc(), "/apis": apis_doc()})
    discovery = Discovery(api)
    assert discovery.resources() == []
    asyncio.run(discovery.refresh())
    assert sorted(api.calls) == [("/api", AGGREGATED_ACCEPT), ("/apis", AGGREGATED_ACCEPT)]
    assert discovery.resources() == parse_aggregated(api_doc()) + parse_aggregated(apis_doc())
    assert discovery.resolve_cached("deploy").group_resource == "deployments.apps"


def test_resources_returns_a_copy() -> None:
    discovery = Discovery(FakeApi({"/api": api_doc(), "/apis": apis_doc()}))
    asyncio.run(discovery.refresh())
    discovery.resources().clear()
    assert discovery.resources()


def test_resolve_loads_on_first_use_only() -> None:
    api = FakeApi({"/api": api_doc(), "/apis": apis_doc()})
    discovery = Discovery(api)

    async def scenario() -> tuple[ResourceInfo, ResourceInfo]:
        return await discovery.resolve("pods"), await discovery.resolve("deployments.apps")

    pods, deploy = asyncio.run(scenario())
    assert (str(pods), str(deploy)) == ("pods", "deployments.apps")
    assert sorted(api.paths()) == ["/api", "/apis"]


def test_resolve_refreshes_once_on_miss_and_finds_new_crd() -> None:
    api = FakeApi({"/api": api_doc(), "/apis": apis_doc(with_crd=False)})
    discovery = Discovery(api)
    asyncio.run(discovery.refresh())
    with pytest.raises(ConfigError, match="unknown resource 'widgets'"):
        discovery.resolve_cached("widgets")

    api.docs["/apis"] = apis_doc(with_crd=True)  # the CRD got installed
    api.calls.clear()
    widgets = asyncio.run(discovery.resolve("widgets"))
    assert (widgets.group, widgets.version) == ("example.com", "v1")
    assert sorted(api.paths()) == ["/api", "/apis"]


def test_resolve_unknown_after_refresh_raises_without_looping() -> None:
    api = FakeApi({"/api": api_doc(), "/apis": apis_doc()})
    discovery = Discovery(api)
    with pytest.raises(ConfigError, match="unknown resource 'nope'"):
        asyncio.run(discovery.resolve("nope"))  # first load: one refresh, not two
    assert sorted(api.paths()) == ["/api", "/apis"]
    api.calls.clear()
    with pytest.raises(ConfigError, match="unknown resource 'nope'"):
        asyncio.run(discovery.resolve("nope"))  # loaded: one retry refresh
    assert sorted(api.paths()) == ["/api", "/apis"]


def test_resolve_does_not_refresh_for_ambiguous_or_unwatchable_names() -> None:
    api = FakeApi({"/api": api_doc(), "/apis": apis_doc()})
    discovery = Discovery(api)
    asyncio.run(discovery.refresh())
    api.calls.clear()
    with pytest.raises(ConfigError, match="ambiguous"):
        asyncio.run(discovery.resolve("things"))
    with pytest.raises(ConfigError, match="cannot be listed and watched"):
        asyncio.run(discovery.resolve("bindings"))
    assert api.calls == []


def test_resolve_cached_before_refresh() -> None:
    with pytest.raises(RuntimeError, match="refresh"):
        Discovery(FakeApi({})).resolve_cached("pods")


def test_legacy_fallback_walks_group_versions_and_skips_failures(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = FakeApi(
        {
            "/api": LEGACY_API,
            "/apis": LEGACY_APIS,
            "/api/v1": LEGACY_CORE_V1,
            "/apis/apps/v1": LEGACY_APPS_V1,
            "/apis/example.com/v1": LEGACY_EXAMPLE_V1,
            "/apis/example.com/v1beta1": LEGACY_EXAMPLE_V1BETA1,
        },
        errors={
            "/apis/metrics.k8s.io/v1beta1": ApiError(503, "ServiceUnavailable",
                                                     "the server is currently unable")
        },
    )
    discovery = Discovery(api)
    asyncio.run(discovery.refresh())

    assert [(r.group, r.version, r.plural) for r in discovery.resources()] == [
        ("", "v1", "namespaces"),
        ("", "v1", "pods"),
        ("apps", "v1", "deployments"),
        ("example.com", "v1", "widgets"),
        ("example.com", "v1beta1", "widgets"),
    ]
    walked = [call for call in api.calls if call[0] not in ("/api", "/apis")]
    assert sorted(walked) == sorted(
        (path, "application/json")
        for path in ["/api/v1", "/apis/apps/v1", "/apis/example.com/v1",
                     "/apis/example.com/v1beta1", "/apis/metrics.k8s.io/v1beta1"]
    )
    assert "skipping /apis/metrics.k8s.io/v1beta1" in caplog.text
    assert discovery.resolve_cached("widgets").version == "v1"
    pods = discovery.resolve_cached("pods")
    assert pods.path("ns", "p", "log") == "/api/v1/namespaces/ns/pods/p/log"


def test_mixed_roots_aggregated_core_legacy_groups() -> None:
    api = FakeApi({"/api": api_doc(), "/apis": LEGACY_APIS, "/apis/apps/v1": LEGACY_APPS_V1})
    discovery = Discovery(api)
    asyncio.run(discovery.refresh())  # example.com and metrics 404: skipped
    assert discovery.resolve_cached("deploy").group == "apps"
    assert discovery.resolve_cached("pods").group == ""


def test_root_errors_propagate_and_keep_previous_data() -> None:
    api = FakeApi({"/api": api_doc(), "/apis": apis_doc()})
    discovery = Discovery(api)
    asyncio.run(discovery.refresh())
    before = discovery.resources()
    api.errors["/apis"] = ApiError(500, "InternalError")
    with pytest.raises(ApiError):
        asyncio.run(discovery.refresh())
    assert discovery.resources() == before


def test_slow_older_refresh_does_not_overwrite_newer_one() -> None:
    docs = [apis_doc(with_crd=False), apis_doc(with_crd=True)]

    async def scenario() -> list[ResourceInfo]:
        gate = asyncio.Event()
        served = 0

        async def get_json(path: str, accept: str) -> Any:
            nonlocal served
            if path == "/api":
                return api_doc()
            doc = docs[served]
            served += 1
            if doc is docs[0]:
                await gate.wait()  # the first (older) refresh stalls on /apis
            return doc

        discovery = Discovery(get_json)
        older = asyncio.create_task(discovery.refresh())
        await asyncio.sleep(0)
        await discovery.refresh()  # the newer one sees the CRD and finishes first
        gate.set()
        await older
        return discovery.resources()

    assert any(r.plural == "widgets" for r in asyncio.run(scenario()))
