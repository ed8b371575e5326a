"""Access: the start-up check that this identity holds every grant the registrations need.

One ``SelfSubjectAccessReview`` (``authorization.k8s.io/v1``) per grant and namespace, sent
concurrently (:data:`CONCURRENCY` at a time), before any informer starts: a missing permission then stops the start with one line
each and the ``declop rbac`` command that prints the fix, instead of a stream of 403s from
informers and writes later.

Invariants:
- a missing *required* grant (declop sends it itself: informers, the finalizer patch, Leases,
  webhooks) raises :class:`MissingPermissions`; a missing grant for a write the handler *may* do
  (``owns=`` children, ``/status``, Events) is logged as a warning, one line each, and the start
  goes on — declop cannot know that the handler writes at all (the manager reviews those while
  the caches fill, so they add nothing to the start);
- where the operator watches namespaces, each is reviewed in that namespace; otherwise
  cluster-wide (``namespace`` empty). Leases and the webhook CA are reviewed in their namespace;
- a review that cannot be made (refused, unreachable, an old apiserver) is warned about once and
  the start goes on: the check only replaces 403s later, it never blocks on itself.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence

from declop.errors import ConfigError
from declop.kube.rbac import CLUSTER, WATCHED, ClusterScoped, Grant, is_cluster_scoped

__all__ = ["Denied", "MissingPermissions", "REVIEW_PATH", "check_access", "review", "review_body", "reviews"]

log = logging.getLogger("declop.access")

REVIEW_PATH = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
#: reviews in flight at once: more buys nothing, each new connection is a TLS handshake on the loop
CONCURRENCY = 8

Request = Callable[..., Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Denied:
    """A grant the apiserver said this identity lacks, in ``namespace`` (``""``: cluster-wide)."""

    grant: Grant
    namespace: str
    cluster_scoped: bool = False

    def __str__(self) -> str:
        g = self.grant
        if self.namespace:
            where = f"in namespace {self.namespace}"
        else:
            where = "in all namespaces" if g.where is WATCHED and not self.cluster_scoped else "cluster-wide"
        return f"missing permission: {g.verb} {g.target} {where}"


class MissingPermissions(ConfigError):
    """The identity lacks grants declop needs: one line per missing grant, then the fix."""

    def __init__(self, denied: Sequence[Denied], command: str) -> None:
        self.denied = tuple(denied)
        lines = [
            f"this identity lacks {len(denied)} permission{'s' if len(denied) != 1 else ''} the handlers need "
            "(SelfSubjectAccessReview):",
            *(str(d) for d in denied),
            f"print the RBAC the handlers need with: {command}",
        ]
        super().__init__("\n".join(lines))


def reviews(
    grants: Sequence[Grant], namespaces: Sequence[str], cluster_scoped: ClusterScoped = is_cluster_scoped
) -> list[tuple[Grant, str]]:
    """(grant, namespace) pairs to review: watched grants in each watched namespace (or ``""``),
    cluster-scoped resources (nodes …) cluster-wide."""
    out: list[tuple[Grant, str]] = []
    for g in grants:
        if g.where is WATCHED and cluster_scoped(g.group, g.resource):
            out.append((g, ""))
        elif g.where is WATCHED:
            out.extend((g, ns) for ns in (namespaces or ("",)))
        else:
            out.append((g, g.where or ""))
    return out


def review_body(grant: Grant, namespace: str) -> dict[str, Any]:
    """The SelfSubjectAccessReview asking for ``grant`` in ``namespace``."""
    plural, _, sub = grant.resource.partition("/")
    attributes = {"group": grant.group, "resource": plural, "verb": grant.verb}
    if sub:
        attributes["subresource"] = sub
    if grant.name:
        attributes["name"] = grant.name
    if namespace:
        attributes["namespace"] = namespace
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes},
    }


async def review(request: Request, grant: Grant, namespace: str) -> bool:
    """Whether the apiserver allows ``grant`` in ``namespace`` to this identity; raises ApiError."""
    answer = await request("POST", REVIEW_PATH, body=review_body(grant, namespace), lane="informer")
    return bool(((answer or {}).get("status") or {}).get("allowed"))


async def check_access(
    request: Request,
    grants: Sequence[Grant],
    *,
    namespaces: Sequence[str],
    command: str,
    cluster_scoped: ClusterScoped = is_cluster_scoped,
) -> None:
    """Review every grant at once; raise :class:`MissingPermissions` for missing required ones,
    warn for missing optional ones, warn once and return if the reviews cannot be made."""
    pairs = reviews(grants, namespaces, cluster_scoped)
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(grant: Grant, namespace: str) -> bool:
        async with gate:
            return await review(request, grant, namespace)

    results = await asyncio.gather(*(one(g, ns) for g, ns in pairs), return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        first = failures[0]
        if not isinstance(first, Exception):
            raise first  # a cancellation
        log.warning(
            "Could not check this identity's permissions (SelfSubjectAccessReview failed); going on without the check",
            extra={"kv": {"error": str(first) or type(first).__name__}},
        )
        return
    denied = [Denied(g, ns, cluster_scoped(g.group, g.resource)) for (g, ns), allowed in zip(pairs, results) if not allowed]
    log.debug("Reviewed permissions", extra={"kv": {"reviews": len(pairs), "missing": len(denied)}})
    for d in denied:
        if not d.grant.required:
            log.warning(f"{d} (a write the handlers may do: {d.grant.why})")
    required = [d for d in denied if d.grant.required]
    if required:
        raise MissingPermissions(required, command)
