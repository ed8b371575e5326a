"""Catalog: the resources a name may mean — the apiserver's, or, without one, Kubernetes' own.

``declop run`` reads a resource name (``"Deployment"``, ``"deploy"``, ``"deployments.apps"``,
``Widget``) with :func:`declop.kube.discovery.resolve` against what the apiserver serves. RBAC
needs the same reading where there may be no apiserver (``declop rbac`` on a laptop, ``declop
new``), so a :class:`Catalog` holds a list of :class:`~declop.kube.discovery.ResourceInfo` —
from discovery when a cluster answers (:func:`discover`), else the standard table
(:data:`declop.kube.apiresources.RESOURCES`, generated from a real apiserver's discovery) — plus
the typed models loaded in this process (:func:`typed_resources`), and resolves names against
it with discovery's own resolver.

Invariants:
- a name resolves to what :func:`~declop.kube.discovery.resolve` says for the same resources
  (kinds, singulars, short names, ``plural.group``, ``plural.version.group``), except that RBAC
  also takes resources that cannot be listed and watched (``tokenreviews`` in ``permissions=``);
- a name the catalog does not know is refused in one line naming the right spelling, unless it
  names an API group Kubernetes itself does not serve (``gizmos.example.com`` before its CRD is
  installed, with no typed model): that one is read as ``plural.group`` — nothing can check it
  here, and ``declop run`` says at start whether the apiserver serves it;
- the scope of a resource is what its entry says (a model's ``scope=``, the apiserver's
  ``namespaced``); a resource the catalog does not know is namespaced;
- served resources come before typed models, so the apiserver's word wins over a model's.
"""

from __future__ import annotations

import asyncio
import re
import sys
from typing import Any, Iterable, Sequence

from declop.errors import ConfigError
from declop.kube.apiresources import KUBERNETES_VERSION, RESOURCES
from declop.kube.discovery import Discovery, ResourceInfo, resolve

__all__ = ["CRD_VERBS", "STANDARD_GROUPS", "Catalog", "discover", "read_name", "typed_resources"]

#: the verbs the apiserver serves on every custom resource
CRD_VERBS = ("delete", "deletecollection", "get", "list", "patch", "create", "update", "watch")
_VERSION = re.compile(r"v\d+(?:alpha\d+|beta\d+)?")
#: the API groups Kubernetes itself serves ("" is core): a name there must be one of their resources
STANDARD_GROUPS = frozenset(r.group for r in RESOURCES)


def read_name(name: str) -> tuple[str, str]:
    """``(group, plural)`` from the spelling alone: ``"pods"`` → ``("", "pods")``,
    ``"widgets.example.com"`` and ``"widgets.v1.example.com"`` → ``("example.com", "widgets")``,
    ``"pods.v1"`` → ``("", "pods")``. No table: a bare name is core, a singular stays singular."""
    plural, dot, rest = name.strip().lower().partition(".")
    if not dot:
        return "", plural
    version, _, group = rest.partition(".")
    return (group, plural) if _VERSION.fullmatch(version) else (rest, plural)


def typed_resources() -> list[ResourceInfo]:
    """A resource for every typed model (:class:`declop.typed.model.CustomResource` subclass that
    names a kind) loaded in this process, with the model's scope; none when no model module was
    imported (this never imports pydantic)."""
    model = sys.modules.get("declop.typed.model")
    if model is None:
        return []
    out: dict[tuple[str, str, str], ResourceInfo] = {}
    pending = list(model.CustomResource.__subclasses__())
    while pending:
        cls = pending.pop(0)
        pending.extend(cls.__subclasses__())
        kind = cls.__dict__.get("__kind__")
        if kind is None:
            continue
        out.setdefault((kind.group, kind.version, kind.plural), ResourceInfo(
            group=kind.group, version=kind.version, plural=kind.plural, kind=kind.kind,
            namespaced=kind.scope == "Namespaced", singular=kind.singular, short_names=tuple(kind.short_names),
            verbs=CRD_VERBS, subresources=("status",) if kind.status else (),
        ))  # fmt: skip
    # a kind's storage version first, as a CRD lists it; then by name, whatever the import order
    return sorted(out.values(), key=lambda r: (r.group, r.plural, r.version))


class Catalog:
    """Resources to resolve names against, in server order, and where they came from."""

    def __init__(self, resources: Iterable[ResourceInfo], *, source: str, unknown: str = "not served by the apiserver") -> None:
        self.resources: tuple[ResourceInfo, ...] = tuple(resources)
        #: where the resources came from: "the apiserver at https://…", "Kubernetes v1.36.3's standard resources"
        self.source = source
        #: why a name that matches nothing is unknown, in the one-line error
        self.unknown = unknown
        self._scopes: dict[tuple[str, str], bool] = {}
        for r in self.resources:
            self._scopes.setdefault((r.group, r.plural), r.namespaced)

    @classmethod
    def standard(cls, *, models: bool = True) -> Catalog:
        """Kubernetes' own resources (no cluster asked), and with ``models`` the typed models."""
        extra = typed_resources() if models else []
        return cls(
            [*RESOURCES, *extra], source=f"Kubernetes {KUBERNETES_VERSION}'s standard resources",
            unknown=f"neither a standard Kubernetes {KUBERNETES_VERSION} resource nor a typed model's (no cluster was asked)",
        )  # fmt: skip

    @classmethod
    def served(cls, resources: Sequence[ResourceInfo], *, source: str, models: bool = True) -> Catalog:
        """What an apiserver serves, then the typed models it does not serve (yet)."""
        known = {(r.group, r.plural) for r in resources}
        extra = [r for r in typed_resources() if (r.group, r.plural) not in known] if models else []
        return cls([*resources, *extra], source=source)

    def info(self, name: str) -> ResourceInfo:
        """The resource ``name`` means (subresource aside), as ``declop run`` resolves it.

        Raises:
            ConfigError: unknown (with the closest spellings), or ambiguous across groups.
        """
        return resolve(name.partition("/")[0], self.resources, watchable=False, unknown=self.unknown)

    def resolve(self, name: str) -> tuple[str, str]:
        """``(group, plural)`` of ``name`` (:data:`declop.kube.rbac.Resolve`); a name it does not
        know, of a group Kubernetes does not serve, is read from its spelling (:func:`read_name`).

        Raises:
            ConfigError: the name is not one this catalog's resources answer to.
        """
        try:
            info = self.info(name)
        except ConfigError:
            group, plural = read_name(name.partition("/")[0])
            if "." in name and group not in STANDARD_GROUPS:
                return group, plural
            raise
        return info.group, info.plural

    def lenient(self, name: str) -> tuple[str, str]:
        """:meth:`resolve`, or the spelling's reading for a name it refuses: for defaults that
        must not raise (the checks that run later say what is wrong with the name)."""
        try:
            return self.resolve(name)
        except ConfigError:
            return read_name(name.partition("/")[0])

    def cluster_scoped(self, group: str, resource: str) -> bool:
        """Whether ``resource`` (``plural`` or ``plural/sub``) of ``group`` is cluster-scoped
        (:data:`declop.kube.rbac.ClusterScoped`); unknown resources are namespaced."""
        return self._scopes.get((group, resource.partition("/")[0])) is False


async def discover(configuration: Any, *, timeout: float = 5.0) -> list[ResourceInfo]:
    """Every resource the apiserver of ``configuration`` serves (one discovery, no retries).

    Raises:
        ApiError: the apiserver answered with an error, or could not be reached.
        TimeoutError: no answer within ``timeout`` seconds.
    """
    from declop.kube.transport import Transport

    transport = Transport(configuration, retries=0)

    async def get_json(path: str, accept: str) -> Any:
        return await transport.request("GET", path, accept=accept)

    try:
        discovery = Discovery(get_json)
        await asyncio.wait_for(discovery.refresh(), timeout)
        return discovery.resources()
    finally:
        await transport.close()
