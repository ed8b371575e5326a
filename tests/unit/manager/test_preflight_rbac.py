"""The start-up permission check's advice (declop.manager.preflight): the ``declop rbac`` command
it names gets ``--service-account`` when the identity is a ServiceAccount, so the manifests it
prints bind every Role and ClusterRole; and the grants it reviews are read with the same
:class:`~declop.kube.catalog.Catalog` as ``declop rbac`` reads them (scopes, Events).
tests/integration/test_rbac_generated.py runs both on the real apiserver."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from declop.errors import ApiError
from declop.kube.apiresources import RESOURCES
from declop.kube.catalog import Catalog
from declop.kube.discovery import ResourceInfo
from declop.kube.rbac import WATCHED, Source, manifests, needs
from declop.manager.preflight import SELF_REVIEW_PATH, advice


class Answers:
    """A transport whose SelfSubjectReview answers ``username`` (or raises ``error``)."""

    def __init__(self, username: str = "", error: ApiError | None = None) -> None:
        self.username, self.error, self.sent = username, error, []

    async def request(self, method: str, path: str, **kw: Any) -> Any:
        self.sent.append((method, path, kw.get("body")))
        if self.error is not None:
            raise self.error
        return {"status": {"userInfo": {"username": self.username}}}


@pytest.mark.parametrize(
    ("username", "expected"),
    [
        ("system:serviceaccount:ops:my-op", "declop rbac h.py -n a --service-account ops:my-op"),
        ("alice", "declop rbac h.py -n a"),  # a user: no binding to print
        ("system:serviceaccount:broken", "declop rbac h.py -n a"),
    ],
)
def test_the_advice_binds_to_the_service_account_the_operator_runs_as(username: str, expected: str) -> None:
    transport = Answers(username)
    assert asyncio.run(advice(transport, "declop rbac h.py -n a")) == expected
    assert transport.sent == [("POST", SELF_REVIEW_PATH, {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})]


def test_the_advice_is_unchanged_when_the_apiserver_cannot_say_or_it_is_given() -> None:
    assert asyncio.run(advice(Answers(error=ApiError(404, "NotFound", "old apiserver")), "declop rbac h.py")) == "declop rbac h.py"
    given = Answers("system:serviceaccount:ops:x")
    assert asyncio.run(advice(given, "declop rbac h.py --service-account a:b")) == "declop rbac h.py --service-account a:b"
    assert given.sent == []


def test_a_cluster_scoped_primary_read_from_discovery_is_granted_cluster_wide_with_its_events_in_default() -> None:
    """What the check reviews for a CRD the apiserver serves with scope Cluster (no model in this
    process): the same grants ``declop rbac -n`` prints, a ClusterRole and Events in default."""
    served = [*RESOURCES, ResourceInfo("example.com", "v1", "racks", "Rack", namespaced=False, singular="rack", verbs=("get", "list", "watch"))]
    names = Catalog.served(served, source="test", models=False)
    grants = needs([Source("Rack", owns=("configmaps",))], resolve=names.resolve, cluster_scoped=names.cluster_scoped)
    assert {(g.where, g.group, g.resource) for g in grants if g.resource.startswith("events")} == {("default", "events.k8s.io", "events")}
    assert ("example.com", "racks") in {(g.group, g.resource) for g in grants if g.where is WATCHED}
    docs = manifests(grants, namespaces=("team",), cluster_scoped=names.cluster_scoped)
    kinds = {(d["kind"], d["metadata"].get("namespace")): [r["resources"][0] for r in d["rules"]] for d in docs}
    assert kinds == {
        ("ClusterRole", None): ["racks", "racks/finalizers", "racks/status"],
        ("Role", "default"): ["events"],
        ("Role", "team"): ["configmaps"],
    }
