"""RBAC: the permissions an operator needs, as Kubernetes rules — computed, never hand-typed.

Owns :class:`Permission` (the spelling of ``@declop.reconciler(..., permissions=[...])``: one verb
on one resource, optionally one object by name), :class:`Grant` (one permission resolved to an
API group, a resource and *where*: the watched namespaces, the whole cluster, or one namespace),
:func:`group_resource` (a resource name as registered → API group and plural, without an
apiserver), :func:`needs` (what a set of registrations needs, from plain inputs) and the
rendering of grants as Role/ClusterRole manifests (:func:`manifests`) or rules (:func:`rules`).
It does not own the registry (``declop.registry`` turns its registrations into :class:`Source`
values) nor the check against the apiserver (:mod:`declop.kube.access`).

Invariants:
- the verbs are exactly what declop's own code sends (the same list as the chart's
  ``files/permissions.json``; ``tests/unit/kube/test_rbac.py`` compares them): nothing is granted
  that declop never sends, except the writes a handler may do (``owns=`` children, ``/status``
  of a custom resource, Events), which are marked ``required=False``;
- the output is deterministic: grants are sorted, rules merge verbs in one canonical order, so
  the same registrations print byte-identical YAML;
- a :class:`Permission` is validated when it is made: a bad verb, an empty or wildcard resource
  raise :class:`~declop.errors.RegistrationError` in one line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from declop.errors import ConfigError, RegistrationError
from declop.kube.catalog import STANDARD_GROUPS, Catalog

__all__ = [
    "CLUSTER",
    "ClusterScoped",
    "VERBS",
    "WATCHED",
    "Grant",
    "Permission",
    "Resolve",
    "Source",
    "group_resource",
    "is_cluster_scoped",
    "is_custom",
    "manifests",
    "needs",
    "reasons",
    "rules",
    "to_yaml",
    "values",
    "values_yaml",
]

#: the order verbs are written in a rule (kubectl's order); any other verb sorts after them
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
_OTHER_VERBS = frozenset({"use", "bind", "escalate", "impersonate", "approve", "sign"})

#: where a grant applies: the namespaces the operator watches (a ClusterRole, or a Role in each)
WATCHED = None
#: where a grant applies: cluster-scoped objects (always a ClusterRole)
CLUSTER = ""

# the verbs declop sends, by feature (charts/declop/files/permissions.json says the same)
SOURCE_VERBS = ("get", "list", "watch")
FINALIZER_VERBS = ("patch",)
#: declop's records on the primary (docs/changes.md: the last-handled snapshot)
RECORD_VERBS = ("patch",)
STATUS_VERBS = ("patch", "update")
OWNED_VERBS = ("create", "update", "patch", "delete")
OWNER_FINALIZERS_VERBS = ("update",)
EVENT_VERBS = ("create", "patch")
LEADER_UNNAMED, LEADER_NAMED = ("create",), ("get", "update")
SHARD_VERBS = ("get", "list", "create", "update", "delete")
WEBHOOK_CONFIGURATION_VERBS = ("patch",)
CONVERSION_VERBS = ("patch",)
CA_SECRET_VERBS = ("get", "update")
METRICS_AUTH_VERBS = ("create",)

#: Kubernetes' own resources (no cluster asked), for the defaults that read a name offline
_STANDARD = Catalog.standard(models=False)
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def group_resource(name: str) -> tuple[str, str]:
    """``(apiGroup, plural)`` of a resource name as registered, read against Kubernetes' standard
    resources (:class:`~declop.kube.catalog.Catalog`), never raising: the default where no
    catalog is given.

    ``"pods"`` → ``("", "pods")``; ``"deployments"``, ``"Deployment"``, ``"deploy"`` and
    ``"deployments.apps"`` → ``("apps", "deployments")``; ``"widgets.example.com"`` and
    ``"widgets.v1.example.com"`` (the name a typed model registers) → ``("example.com",
    "widgets")``. A subresource stays on the plural: ``"widgets.example.com/status"`` →
    ``("example.com", "widgets/status")``. A name nothing answers to is read from its spelling;
    ``declop rbac`` and the start-up check use :meth:`Catalog.resolve`, which refuses it.
    """
    text, slash, sub = name.strip().partition("/")
    group, plural = _STANDARD.lenient(text)
    return group, plural + (f"/{sub}" if slash else "")


def is_cluster_scoped(group: str, resource: str) -> bool:
    """Whether ``resource`` (``plural`` or ``plural/sub``) of ``group`` is a standard
    cluster-scoped one (nodes, namespaces …); a :class:`~declop.kube.catalog.Catalog` knows the
    scope of custom resources and typed models too."""
    return _STANDARD.cluster_scoped(group, resource)


ClusterScoped = Callable[[str, str], bool]


def is_custom(group: str) -> bool:
    """Whether resources of ``group`` are custom resources (not served by Kubernetes itself)."""
    return group not in STANDARD_GROUPS and not group.endswith(".k8s.io")


@dataclass(frozen=True, slots=True)
class Permission:
    """One verb on one resource, optionally one object by name: a write declop cannot infer.

    ``@declop.reconciler("widgets.example.com", permissions=[("create", "configmaps")])`` — each
    entry is a ``Permission`` or a ``(verb, resource)`` / ``(verb, resource, name)`` tuple.
    ``resource`` is a name as registered (``"configmaps"``, ``"deployments.apps"``,
    ``"widgets.example.com/status"``); ``name`` limits it to one object (``resourceNames``).
    The grant applies where the operator watches (a ClusterRole, or a Role in each namespace).
    """

    verb: str
    resource: str
    name: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.verb, str) or self.verb not in (*VERBS, *_OTHER_VERBS):
            raise RegistrationError(
                f"permissions=: unknown verb {self.verb!r}; use one of {', '.join(VERBS)}"
            )
        if not isinstance(self.resource, str) or not self.resource.strip() or "*" in self.resource:
            raise RegistrationError(
                f"permissions=: resource must be a name like 'configmaps' or 'deployments.apps' (no wildcards), got {self.resource!r}"
            )
        if not isinstance(self.name, str) or (self.name and not _NAME.match(self.name)):
            raise RegistrationError(f"permissions=: name must be an object name like 'my-config', got {self.name!r}")
        object.__setattr__(self, "resource", self.resource.strip())

    @classmethod
    def of(cls, value: Any) -> Permission:
        """``value`` as a Permission: a ``(verb, resource[, name])`` tuple or a Permission."""
        if isinstance(value, Permission):
            return value
        if isinstance(value, tuple) and len(value) in (2, 3) and all(isinstance(v, str) for v in value):
            return cls(*value)
        raise RegistrationError(
            f"permissions= entries are ('verb', 'resource') or ('verb', 'resource', 'name') tuples, got {value!r}"
        )


@dataclass(frozen=True, slots=True)
class Grant:
    """One verb on one resource (``plural`` or ``plural/subresource``) of one API group.

    ``where``: :data:`WATCHED` (the namespaces the operator watches), :data:`CLUSTER` (a
    cluster-scoped object) or a namespace name. ``name`` limits it to one object (``""``: any).
    ``required``: declop itself sends it, or ``permissions=`` declares it (start-up stops when it
    is missing), else it is a write a handler may do (start-up warns). ``why`` says which
    declaration asks for it. Sort grants with the order :func:`needs` returns, not with ``<``.
    """

    where: str | None
    group: str
    resource: str
    name: str
    verb: str
    required: bool = field(default=True, compare=False)
    why: str = field(default="", compare=False)
    #: the handlers ask for it (sources, writes, Events, ``permissions=``) — not declop's own
    #: machinery (Leases, webhooks, their CA, metrics checks), which the chart grants by itself
    handlers: bool = field(default=True, compare=False)

    @property
    def target(self) -> str:
        """The resource as ``kubectl auth can-i`` names it (``plural.group/subresource``), then the
        object when limited to one: ``widgets.example.com/status``, ``secrets 'declop-webhook-ca'``."""
        plural, slash, sub = self.resource.partition("/")
        qualified = f"{plural}.{self.group}" if self.group else plural
        return f"{qualified}{slash}{sub}" + (f" {self.name!r}" if self.name else "")


@dataclass(frozen=True, slots=True)
class Source:
    """What one reconciler registration declares, as :func:`needs` reads it."""

    resource: str
    finalizer: bool = False
    owns: tuple[str, ...] = ()
    watches: tuple[str, ...] = ()
    permissions: tuple[Permission, ...] = ()
    name: str = ""
    #: the registration's own ``namespaces=`` (None: where the operator watches)
    namespaces: tuple[str, ...] | None = None
    #: declop keeps a record on the primary for it (a field-change snapshot annotation): patch
    records: bool = False


Resolve = Callable[[str], "tuple[str, str]"]


def needs(
    sources: Sequence[Source],
    *,
    reads: Iterable[str] = (),
    leader: tuple[str, str] | None = None,
    shards: str | None = None,
    webhook_name: str | None = None,
    admission: bool = False,
    converters: Iterable[str] = (),
    ca_secret_namespace: str | None = None,
    metrics_auth: bool = False,
    resolve: Resolve = group_resource,
    cluster_scoped: ClusterScoped = is_cluster_scoped,
) -> list[Grant]:
    """Every grant the registrations need, sorted and without duplicates.

    Args:
        sources: the reconcilers.
        reads: other resources the cache lists and watches (indexes, transforms).
        leader: ``(namespace, lease name)`` with leader election.
        shards: the Lease namespace with sharding (range and member Lease names are not known).
        webhook_name: the name of the webhook configurations (and ``<name>-webhook-ca``).
        admission: validators or mutators are registered (the configurations are applied).
        converters: resources with a ``@declop.converter`` (their CRD's ``spec.conversion``).
        ca_secret_namespace: where declop keeps its generated webhook CA (None: mounted certs).
        metrics_auth: secure metrics (``--metrics-port``, HTTPS by default) check each caller's
            token and access: ``create`` on TokenReviews and SubjectAccessReviews (optional:
            without them scrapes are refused, reconciling goes on).
        resolve: name → (apiGroup, plural); the offline :func:`group_resource` by default. A
            :class:`~declop.errors.ConfigError` it raises is re-raised naming the declaration.
        cluster_scoped: the scope of a resource: a cluster-scoped primary's Events go to
            namespace ``default``, where the apiserver puts them (an Event lives in its
            involved object's namespace).

    Raises:
        ConfigError: ``resolve`` refused a name (one line: which declaration, and the spelling).
    """
    out: dict[Grant, Grant] = {}

    def named(name: str, who: str) -> tuple[str, str]:
        try:
            return resolve(name)
        except ConfigError as exc:
            raise ConfigError(f"{who}: {exc}") from None

    def add(where: str | None, name: str, verbs: Iterable[str], why: str, *, required: bool = True,
            sub: str = "", object_name: str = "", handlers: bool = True) -> None:  # fmt: skip
        base, _, given_sub = name.partition("/")
        group, plural = named(base, why.partition(": ")[0])
        resource = f"{plural}/{sub or given_sub}" if (sub or given_sub) else plural
        for verb in verbs:
            grant = Grant(where, group, resource, object_name, verb, required, why, handlers)
            if grant in out and out[grant].required and not required:
                continue
            out[grant] = grant

    covered: set[tuple[str, str]] = set()
    for src in sources:
        who = f"@reconciler {src.name!r}" if src.name else "@reconciler"
        group, plural = named(src.resource, who)
        covered.update({(group, plural), *(named(o, f"{who} owns=") for o in src.owns),
                        *(named(w, f"{who} watches=") for w in src.watches)})  # fmt: skip
        wheres = (WATCHED,) if src.namespaces is None else src.namespaces
        for where in wheres:
            add(where, src.resource, SOURCE_VERBS, f"{who}: the primary's informer (get for client.live.get)")
            if src.finalizer:
                add(where, src.resource, FINALIZER_VERBS, f"{who}: finalizer= (a JSON patch of metadata.finalizers)")
            if src.records:
                add(where, src.resource, RECORD_VERBS, f"{who}: old/new/diff or field= (a merge patch of its snapshot annotation)")
            if is_custom(group):
                add(where, src.resource, STATUS_VERBS, f"{who}: status writes (client.patch_status, update(subresource='status'))",
                    required=False, sub="status")  # fmt: skip
            for owned in src.owns:
                add(where, owned, SOURCE_VERBS, f"{who}: owns= informer")
                add(where, owned, OWNED_VERBS, f"{who}: owns= children the handler writes", required=False)
            if src.owns:
                add(where, src.resource, OWNER_FINALIZERS_VERBS,
                    f"{who}: children's ownerReferences with blockOwnerDeletion (OwnerReferencesPermissionEnforcement)",
                    required=False, sub="finalizers")  # fmt: skip
            for watched in src.watches:
                add(where, watched, SOURCE_VERBS, f"{who}: watches= informer")
            for p in src.permissions:
                add(where, p.resource, (p.verb,), f"{who}: permissions=", object_name=p.name)
        if cluster_scoped(group, plural):
            add("default", "events.events.k8s.io", EVENT_VERBS,
                "client.event (events.k8s.io/v1; patch folds repeats): a cluster-scoped object's Events go to namespace default",
                required=False)  # fmt: skip
        else:
            for where in wheres:
                add(where, "events.events.k8s.io", EVENT_VERBS, "client.event (events.k8s.io/v1; patch folds repeats)", required=False)
    for name in reads:
        if named(name, "an index or transform") not in covered:  # an index on a source is served by the source's informers
            add(WATCHED, name, SOURCE_VERBS, "an index or transform: its informer")
    if leader is not None:
        namespace, lease = leader
        add(namespace, "leases.coordination.k8s.io", LEADER_UNNAMED, "leader election: create the Lease", handlers=False)
        add(namespace, "leases.coordination.k8s.io", LEADER_NAMED, "leader election: read and renew the Lease",
            object_name=lease, handlers=False)  # fmt: skip
    if shards is not None:
        add(shards, "leases.coordination.k8s.io", SHARD_VERBS, "sharding: range and member Leases", handlers=False)
    if webhook_name and admission:
        for plural in ("validatingwebhookconfigurations", "mutatingwebhookconfigurations"):
            add(CLUSTER, f"{plural}.admissionregistration.k8s.io", WEBHOOK_CONFIGURATION_VERBS,
                "webhooks: server-side apply of the configuration", object_name=webhook_name, handlers=False)  # fmt: skip
    for resource in sorted(set(converters)):
        group, plural = named(resource, "@converter")
        add(CLUSTER, "customresourcedefinitions.apiextensions.k8s.io", CONVERSION_VERBS,
            "@converter: the CRD's spec.conversion", object_name=f"{plural}.{group}", handlers=False)  # fmt: skip
    if webhook_name and ca_secret_namespace is not None:
        add(ca_secret_namespace, "secrets", CA_SECRET_VERBS, "webhooks: the generated CA, shared by the replicas",
            object_name=f"{webhook_name}-webhook-ca", handlers=False)  # fmt: skip
    if metrics_auth:
        for review in ("tokenreviews.authentication.k8s.io", "subjectaccessreviews.authorization.k8s.io"):
            add(CLUSTER, review, METRICS_AUTH_VERBS, "secure metrics: who may scrape /metrics", required=False, handlers=False)
    return sorted(out.values(), key=_order)


def _order(g: Grant) -> tuple[Any, ...]:
    verb = VERBS.index(g.verb) if g.verb in VERBS else len(VERBS)
    return (g.where is not None, g.where or "", g.group, g.resource, g.name, verb, g.verb)


def rules(grants: Iterable[Grant]) -> list[dict[str, Any]]:
    """RBAC rules for ``grants`` (all of one place): one rule per (group, resource, name), its
    verbs in :data:`VERBS` order, sorted by group then resource."""
    merged: dict[tuple[str, str, str], list[Grant]] = {}
    for g in sorted(grants, key=_order):
        merged.setdefault((g.group, g.resource, g.name), []).append(g)
    out = []
    for (group, resource, name), gs in sorted(merged.items()):
        rule: dict[str, Any] = {"apiGroups": [group], "resources": [resource]}
        if name:
            rule["resourceNames"] = [name]
        rule["verbs"] = list(dict.fromkeys(g.verb for g in sorted(gs, key=_order)))
        out.append(rule)
    return out


def manifests(
    grants: Sequence[Grant],
    *,
    name: str = "declop",
    namespaces: Sequence[str] = (),
    service_account: tuple[str, str] | None = None,
    cluster_scoped: ClusterScoped = is_cluster_scoped,
) -> list[dict[str, Any]]:
    """Role/ClusterRole objects (and bindings to ``service_account``, ``(namespace, name)``).

    Without ``namespaces``: one ClusterRole ``name`` with the grants where the operator watches
    and those of cluster-scoped objects. With ``namespaces``: a Role ``name`` in each, and the
    cluster-scoped ones (webhook configurations, CRDs, and watched resources such as nodes: a Role
    cannot grant them) in the ClusterRole ``<name>-cluster``. Grants of one namespace (Leases, the
    webhook CA, a reconciler's own ``namespaces=``) go into the Role ``name`` of that namespace.
    No labels, fixed names: the same input gives the same objects.
    """
    api = "rbac.authorization.k8s.io/v1"
    docs: list[dict[str, Any]] = []

    def role(kind: str, role_name: str, namespace: str | None, of: list[Grant]) -> None:
        if not of:
            return
        meta: dict[str, Any] = {"name": role_name}
        if namespace:
            meta["namespace"] = namespace
        docs.append({"apiVersion": api, "kind": kind, "metadata": meta, "rules": rules(of)})
        if service_account is not None:
            sa_ns, sa_name = service_account
            docs.append({
                "apiVersion": api, "kind": f"{kind}Binding", "metadata": dict(meta),
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role_name},
                "subjects": [{"kind": "ServiceAccount", "name": sa_name, "namespace": sa_ns}],
            })  # fmt: skip

    watched = [g for g in grants if g.where is WATCHED]
    cluster = [g for g in grants if g.where == CLUSTER]
    local = {ns: [g for g in grants if g.where == ns] for ns in sorted({g.where for g in grants if g.where})}
    if namespaces:
        cluster += [g for g in watched if cluster_scoped(g.group, g.resource)]
        watched = [g for g in watched if not cluster_scoped(g.group, g.resource)]
        for ns in set(namespaces):
            local[ns] = watched + local.get(ns, [])
        role("ClusterRole", f"{name}-cluster", None, cluster)
    else:
        role("ClusterRole", name, None, watched + cluster)
    for ns in sorted(local):
        role("Role", name, ns, local[ns])
    return docs


def values(grants: Sequence[Grant], *, webhooks: bool = False) -> dict[str, Any]:
    """The chart's values for ``grants``: ``rbac.generated`` (the rules the handlers need — the
    chart renders Leases, webhook and metrics RBAC itself, with its release's names; a reconciler's
    own ``namespaces=`` are granted where the chart grants, its ClusterRole or each
    ``watchNamespaces`` Role) and, when webhooks are registered, ``webhooks.enabled`` and the
    converters' ``conversionCRDs``."""
    out: dict[str, Any] = {"rbac": {"generated": rules(g for g in grants if g.handlers)}}
    if webhooks:
        crds = sorted({g.name for g in grants if g.resource == "customresourcedefinitions" and g.where == CLUSTER})
        out["webhooks"] = {"enabled": True, "conversionCRDs": crds}
    return out


def values_yaml(grants: Sequence[Grant], *, webhooks: bool = False, command: str = "declop rbac handlers.py") -> str:
    """The file ``declop rbac ... --values FILE`` writes: :func:`values` as YAML, under a header
    naming ``command`` (the ``declop rbac`` line without ``--values``), which regenerates it.
    ``declop new`` writes a fresh project's ``rbac-values.yaml`` with it."""
    return to_yaml(
        [values(grants, webhooks=webhooks)],
        header=f"Generated by `{command} --values`: the RBAC of these handlers for charts/declop (helm install ... -f this file); regenerate it when the handlers change; see docs/rbac.md.",
    )


def reasons(grants: Iterable[Grant]) -> dict[tuple[str, str, str], list[str]]:
    """Why each rule exists: (group, resource, name) → ``"verbs: declaration"`` lines, one per
    declaration that asks for verbs of it (``"get, list, watch: @reconciler 'w': owns= informer"``)."""
    found: dict[tuple[str, str, str], dict[str, list[str]]] = {}
    for g in sorted(grants, key=_order):
        verbs = found.setdefault((g.group, g.resource, g.name), {}).setdefault(g.why or "declop", [])
        if g.verb not in verbs:
            verbs.append(g.verb)
    return {key: [f"{', '.join(verbs)}: {why}" for why, verbs in whys.items()] for key, whys in found.items()}


def to_yaml(
    docs: Sequence[dict[str, Any]],
    *,
    header: str = "",
    notes: dict[tuple[str, str, str], list[str]] | None = None,
) -> str:
    """``docs`` as multi-document YAML, keys in the order given, lists of plain values on one
    line (``verbs: [get, list, watch]``); ``header`` is a comment line on top, and each rule
    gets its ``notes`` (from :func:`reasons`) as comment lines above it."""
    import yaml  # type: ignore[import-untyped]

    class Dumper(yaml.SafeDumper):  # type: ignore[misc]
        pass

    def flow(dumper: Any, data: list[Any]) -> Any:
        plain = all(isinstance(x, (str, int, float, bool)) for x in data)
        return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=plain)

    Dumper.add_representer(list, flow)

    def dump(data: Any) -> str:
        return str(yaml.dump(data, Dumper=Dumper, sort_keys=False, width=200))

    parts = []
    for doc in docs:
        rules_ = doc.get("rules") if notes is not None else None
        if not rules_:
            parts.append(dump(doc))
            continue
        text = dump({k: v for k, v in doc.items() if k != "rules"}) + "rules:\n"
        for rule in rules_:
            key = (rule["apiGroups"][0], rule["resources"][0], (rule.get("resourceNames") or [""])[0])
            text += "".join(f"# {why}\n" for why in (notes or {}).get(key, ()))
            text += dump([rule])
        parts.append(text)
    start = "---\n" if len(docs) > 1 or header else ""
    return (f"# {header}\n" if header else "") + "".join(start + p for p in parts)
