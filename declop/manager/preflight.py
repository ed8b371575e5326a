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
from typing import Any, Callable, Coroutine

from declop.cache.informer import InformerPool
from declop.errors import ApiError, ConfigError, Forbidden
from declop.kube.access import check_access
from declop.kube.discovery import Discovery
from declop.kube.kubeconfig import pod_namespace
from declop.kube.rbac import Grant, Resolve, group_resource, is_cluster_scoped
from declop.manager.options import Options
from declop.reconcile.registration import Registration
from declop.registry import Registry

__all__ = ["REVIEW", "check_fields", "check_names", "check_permissions", "discover", "grants"]

#: the runnable that reviews the optional grants while the caches fill
REVIEW = "permission check (optional writes)"

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


def grants(options: Options, registry: Registry, resolve: Resolve | None = None) -> list[Grant]:
    """The RBAC grants these registrations and options need (:mod:`declop.kube.rbac`)."""
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
    )


async def check_permissions(
    transport: Any, discovery: Discovery, options: Options, registry: Registry
) -> Callable[[], Coroutine[Any, Any, None]] | None:
    """Review every required grant with the apiserver (a missing one raises); return the review
    of the optional ones (the writes a handler may do: warnings only), to run while the caches
    fill — None when there is none."""

    def resolve(name: str) -> tuple[str, str]:
        try:
            info = discovery.resolve_cached(name)
        except ConfigError:
            return group_resource(name)  # not served (yet): the offline reading
        return info.group, info.plural

    scopes = {(r.group, r.plural): r.namespaced for r in discovery.resources()}

    def cluster_scoped(group: str, resource: str) -> bool:
        namespaced = scopes.get((group, resource.partition("/")[0]))
        return is_cluster_scoped(group, resource) if namespaced is None else not namespaced

    needed = grants(options, registry, resolve)
    started = asyncio.get_running_loop().time()
    check = functools.partial(
        check_access, transport.request, namespaces=options.namespaces,
        command=options.rbac_command, cluster_scoped=cluster_scoped,
    )  # fmt: skip
    await check([g for g in needed if g.required])
    log.debug("Checked the permissions declop needs", extra={"kv": {"seconds": round(asyncio.get_running_loop().time() - started, 4)}})
    optional = [g for g in needed if not g.required]
    return (lambda: check(optional)) if optional else None
