"""Pre-flight: what the manager checks with the apiserver before anything runs.

Discovery answers (or the one line saying why the apiserver cannot be reached), every resource
name a registration, index, transform or webhook uses resolves, every field selector is one the
apiserver supports, and — with ``check_permissions`` — every permission the registrations need
is granted (SelfSubjectAccessReview, :mod:`declop.kube.access`). Each failure is one
:class:`~declop.errors.ConfigError` before any controller starts.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import shlex
from typing import Any, Callable, Coroutine

from declop.cache.informer import InformerPool
from declop.errors import ApiError, ConfigError, Forbidden
from declop.kube.access import MissingPermissions, check_access
from declop.kube.discovery import Discovery
from declop.kube.kubeconfig import pod_namespace
from declop.kube.catalog import Catalog
from declop.kube.rbac import ClusterScoped, Grant, Resolve, group_resource, is_cluster_scoped
from declop.manager.options import Options
from declop.reconcile.registration import Registration
from declop.registry import Registry

__all__ = ["REVIEW", "SELF_REVIEW_PATH", "advice", "check_fields", "check_names", "check_permissions", "discover", "grants"]

#: the runnable that reviews the optional grants while the caches fill
REVIEW = "permission check (optional writes)"
#: who this identity is (authentication.k8s.io/v1, GA in Kubernetes 1.28; every identity may ask)
SELF_REVIEW_PATH = "/apis/authentication.k8s.io/v1/selfsubjectreviews"

log = logging.getLogger("declop.manager")


async def discover(transport: Any) -> Discovery:
    """A refreshed :class:`~declop.kube.discovery.Discovery`, or a ConfigError saying why not."""

    async def get_json(path: str, accept: str) -> Any:
        return await transport.request("GET", path, accept=accept)

    discovery = Discovery(get_json)
    try:
        await discovery.refresh()
    except Forbidden as exc:
        raise ConfigError(f"the apiserver at {transport.host} forbids API discovery to this identity: {exc}") from exc
    except ApiError as exc:
        if exc.status == 0 and exc.reason in ("Unreachable", "Timeout"):
            raise ConfigError(
                f"cannot reach the apiserver at {transport.host} ({exc.reason}); is the cluster running, "
                "and are --kubeconfig/--context right?"
            ) from exc
        if exc.status == 0:  # TLS verification, exec plugin: the message says it all
            raise ConfigError(str(exc)) from exc
        if exc.status == 401:
            raise ConfigError(transport.configuration.explain_401()) from exc
        raise ConfigError(f"API discovery failed at {transport.host}: {exc}") from exc
    return discovery


async def _check(discovery: Discovery, name: str, who: str) -> None:
    try:
        await discovery.resolve(name)
    except ConfigError as exc:
        raise ConfigError(f"{who}: {exc}") from None


async def check_names(discovery: Discovery, registry: Registry, *, webhooks: bool = False) -> None:
    """Resolve every resource name the registry uses (refreshing discovery once for a CRD
    installed just now); with ``webhooks`` the webhooks' resources, else the rest."""
    if webhooks:
        for hook in registry.webhooks:
            await _check(discovery, hook.resource, f"{hook.kind} {hook.name!r}")
        return
    for ix in registry.indexes:
        await _check(discovery, ix.resource, f"index {ix.name!r}")
    for resource_name in registry.transforms:
        await _check(discovery, resource_name, f"transform of {resource_name!r}")
    for reg in registry.registrations:
        await _check(discovery, reg.resource, f"controller {reg.name!r}")
        for owned in reg.owns:
            await _check(discovery, owned.name, f"controller {reg.name!r} owns=")
        for watched, _fn in reg.watches:
            await _check(discovery, watched.name, f"controller {reg.name!r} watches=")


async def check_fields(transport: Any, discovery: Discovery, informers: InformerPool, registrations: list[Registration]) -> None:
    """Ask the apiserver once per (resource, field selector) whether it supports the selector's
    field labels (a LIST of at most one object); a 400 becomes one ConfigError line."""
    seen: set[tuple[str, str]] = set()
    for reg in registrations:
        declared = [(reg.primary, "")] + [(o, " owns=") for o in reg.owns] + [(w, " watches=") for w, _ in reg.watches]
        for res, where in declared:
            if not res.fields:
                continue
            info = discovery.resolve_cached(res.name)
            if (info.group_resource, res.fields) in seen:
                continue
            seen.add((info.group_resource, res.fields))
            scope = informers.scope(info, reg.namespaces)
            path = info.path(namespace=scope[0] or None)
            try:
                await transport.request("GET", path, params={"limit": 1, "fieldSelector": res.fields}, lane="informer")
            except ApiError as exc:
                if exc.status != 400:
                    continue  # not the selector's fault (403, 5xx): the informer reports it as usual
                raise ConfigError(
                    f"controller {reg.name!r}{where}: field selector {res.fields!r} is not supported for "
                    f"{info.group_resource} ({exc}); select on a field the apiserver supports for it, "
                    "or drop fields= and filter with a predicate"
                ) from None


def grants(
    options: Options, registry: Registry, resolve: Resolve | None = None, cluster_scoped: ClusterScoped | None = None
) -> list[Grant]:
    """The RBAC grants these registrations and options need (:mod:`declop.kube.rbac`), names and
    scopes read as ``declop rbac`` reads them when given the same catalog."""
    o = options
    lease_ns = o.leader_election_namespace or pod_namespace()
    ca_ns = None
    if not o.webhook_cert_dir:
        service_ns = o.webhook_service.partition("/")[0] if o.webhook_service and "/" in o.webhook_service else None
        ca_ns = o.webhook_namespace or service_ns or pod_namespace(fallback=None) or "default"
    return registry.grants(
        resolve or group_resource,
        leader=(lease_ns, o.leader_election_id) if o.leader_elect else None,
        shards=lease_ns if o.shards else None,
        webhook_name=o.webhook_name,
        ca_secret_namespace=ca_ns,
        metrics_auth=bool(o.metrics_secure and (o.metrics_port or o.debug_reconciles)),
        cluster_scoped=cluster_scoped or is_cluster_scoped,
    )


async def advice(transport: Any, command: str) -> str:
    """``command`` (a ``declop rbac`` line), with ``--service-account NS:NAME`` when this identity
    is a ServiceAccount (the apiserver's SelfSubjectReview says who it is): the manifests it then
    prints bind every Role and ClusterRole they hold to it — with ``-n`` and a cluster-scoped
    resource there are both, and binding only the Role would fail this check again. Unchanged when
    the identity is not a ServiceAccount, or the apiserver cannot say."""
    if "--service-account" in command:
        return command
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    try:
        answer = await transport.request("POST", SELF_REVIEW_PATH, body=body, lane="informer")
    except ApiError:
        return command
    user = str((((answer or {}).get("status") or {}).get("userInfo") or {}).get("username") or "")
    prefix = "system:serviceaccount:"
    namespace, _, name = user.removeprefix(prefix).partition(":")
    if not user.startswith(prefix) or not namespace or not name:
        return command
    return f"{command} --service-account {shlex.quote(f'{namespace}:{name}')}"


async def check_permissions(
    transport: Any, discovery: Discovery, options: Options, registry: Registry
) -> Callable[[], Coroutine[Any, Any, None]] | None:
    """Review every required grant with the apiserver (a missing one raises); return the review
    of the optional ones (the writes a handler may do: warnings only), to run while the caches
    fill — None when there is none.

    Names and scopes are read from what the apiserver serves (then the typed models), with the
    :class:`~declop.kube.catalog.Catalog` ``declop rbac`` uses: the grants reviewed here are the
    ones that command prints, so the fix it names is one that passes this check.
    """
    catalog = Catalog.served(discovery.resources(), source=f"the apiserver at {transport.host}")
    cluster_scoped = catalog.cluster_scoped
    needed = grants(options, registry, catalog.resolve, cluster_scoped)
    started = asyncio.get_running_loop().time()
    check = functools.partial(
        check_access, transport.request, namespaces=options.namespaces,
        command=options.rbac_command, cluster_scoped=cluster_scoped,
    )  # fmt: skip
    try:
        await check([g for g in needed if g.required])
    except MissingPermissions as exc:
        raise MissingPermissions(exc.denied, await advice(transport, options.rbac_command)) from None
    log.debug("Checked the permissions declop needs", extra={"kv": {"seconds": round(asyncio.get_running_loop().time() - started, 4)}})
    optional = [g for g in needed if not g.required]
    return (lambda: check(optional)) if optional else None
