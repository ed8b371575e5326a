"""declop.kube.access: the start-up permission check, with the apiserver's review answers faked
at the request boundary (the integration tests ask a real apiserver)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from declop.errors import Forbidden
from declop.kube.access import CONCURRENCY, REVIEW_PATH, MissingPermissions, check_access, review_body, reviews
from declop.kube.rbac import Source, needs

COMMAND = "declop rbac handlers.py -n a"


class Reviews:
    """A fake ``request``: answers SelfSubjectAccessReviews, allowing all but ``deny``."""

    def __init__(self, deny: set[tuple[str, str, str]] = set(), fail: BaseException | None = None) -> None:
        self.deny = deny
        self.fail = fail
        self.sent: list[dict[str, Any]] = []
        self.in_flight = self.most = 0

    async def __call__(self, method: str, path: str, *, body: Any, lane: str) -> Any:
        assert (method, path) == ("POST", REVIEW_PATH)
        self.sent.append(body)
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(0)  # yield: the other reviews are sent meanwhile
        self.in_flight -= 1
        if self.fail is not None:
            raise self.fail
        a = body["spec"]["resourceAttributes"]
        resource = a["resource"] + (f"/{a['subresource']}" if "subresource" in a else "")
        return {"status": {"allowed": (a["verb"], resource, a.get("namespace", "")) not in self.deny}}


def test_every_grant_is_reviewed_in_each_watched_namespace_concurrently() -> None:
    grants = needs([Source("widgets.example.com", finalizer=True)], leader=("ops", "lease"))
    fake = Reviews()
    asyncio.run(check_access(fake, grants, namespaces=("a", "b"), command=COMMAND))
    watched = [g for g in grants if g.where is None]
    assert len(fake.sent) == 2 * len(watched) + 3  # + the Lease's create, get, update in ops
    assert fake.most == CONCURRENCY < len(fake.sent)  # as many at once as allowed
    spaces = {b["spec"]["resourceAttributes"].get("namespace") for b in fake.sent}
    assert spaces == {"a", "b", "ops"}


def test_a_review_body_names_the_subresource_and_object() -> None:
    grants = needs([Source("widgets.example.com")], leader=("ops", "lease"))
    status = next(g for g in grants if g.resource == "widgets/status" and g.verb == "patch")
    assert review_body(status, "") == {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"group": "example.com", "resource": "widgets", "verb": "patch", "subresource": "status"}},
    }  # fmt: skip
    lease = next(g for g in grants if g.name == "lease" and g.verb == "get")
    assert review_body(lease, "ops")["spec"]["resourceAttributes"] == {
        "group": "coordination.k8s.io", "resource": "leases", "verb": "get", "name": "lease", "namespace": "ops",
    }  # fmt: skip
    assert [ns for _, ns in reviews([lease], ("a",))] == ["ops"]


def test_a_missing_required_grant_stops_with_one_line_each_and_the_fix() -> None:
    grants = needs([Source("configmaps", finalizer=True)])
    fake = Reviews(deny={("list", "configmaps", "a"), ("patch", "configmaps", "a")})
    with pytest.raises(MissingPermissions) as refused:
        asyncio.run(check_access(fake, grants, namespaces=("a",), command=COMMAND))
    assert str(refused.value).splitlines() == [
        "this identity lacks 2 permissions the handlers need (SelfSubjectAccessReview):",
        "missing permission: list configmaps in namespace a",
        "missing permission: patch configmaps in namespace a",
        f"print the RBAC the handlers need with: {COMMAND}",
    ]
    cluster_wide = Reviews(deny={("watch", "configmaps", "")})
    with pytest.raises(MissingPermissions, match=r"missing permission: watch configmaps in all namespaces"):
        asyncio.run(check_access(cluster_wide, grants, namespaces=(), command=COMMAND))


def test_a_missing_optional_grant_is_a_warning_and_the_start_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    grants = needs([Source("widgets.example.com", owns=("configmaps",))])
    fake = Reviews(deny={("create", "configmaps", ""), ("patch", "widgets/status", "")})
    with caplog.at_level(logging.WARNING, logger="declop.access"):
        asyncio.run(check_access(fake, grants, namespaces=(), command=COMMAND))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "missing permission: create configmaps in all namespaces (a write the handlers may do: @reconciler: owns= children the handler writes)",
        "missing permission: patch widgets.example.com/status in all namespaces (a write the handlers may do: "
        "@reconciler: status writes (client.patch_status, update(subresource='status')))",
    ]


def test_a_review_that_cannot_be_made_is_warned_about_once(caplog: pytest.LogCaptureFixture) -> None:
    grants = needs([Source("configmaps", owns=("secrets",))])
    fake = Reviews(fail=Forbidden("selfsubjectaccessreviews is forbidden"))
    with caplog.at_level(logging.WARNING, logger="declop.access"):
        asyncio.run(check_access(fake, grants, namespaces=(), command=COMMAND))
    assert [r.getMessage() for r in caplog.records] == [
        "Could not check this identity's permissions (SelfSubjectAccessReview failed); going on without the check"
    ]


def test_a_cluster_scoped_resource_is_reviewed_cluster_wide() -> None:
    grants = needs([Source("pods", watches=("nodes",))])
    fake = Reviews(deny={("list", "nodes", "")})
    with pytest.raises(MissingPermissions, match=r"missing permission: list nodes cluster-wide\n"):
        asyncio.run(check_access(fake, grants, namespaces=("a",), command=COMMAND))
    spaces = {(b["spec"]["resourceAttributes"]["resource"], b["spec"]["resourceAttributes"].get("namespace")) for b in fake.sent}
    assert ("nodes", None) in spaces and ("pods", "a") in spaces and ("nodes", "a") not in spaces
