"""The resources the fake apiserver knows: a table of the common Kubernetes resources, CRD
objects given to it, and guesses for the rest.

Owns :class:`FakeDiscovery` (what :class:`~declop.testing.fakes.apiserver.FakeApiServer` resolves names
against, in place of API discovery) and :func:`resources_of_crd`.

Invariants:
- resources given (a :class:`~declop.kube.discovery.ResourceInfo` or a CRD object) win over the
  table; a CRD serves each of its served versions, the storage version first;
- an unknown name like ``widgets.example.com`` or ``widgets.v1.example.com`` is guessed
  (namespaced, with a status subresource) and then known; a bare unknown name is a
  :class:`~declop.errors.ConfigError` saying how to declare it;
- an object of an unknown apiVersion/kind is learned from the object itself (namespaced when it
  has a namespace);
- custom resources, and built-ins marked so in the table, have a ``metadata.generation``;
- the field labels a resource serves in a ``fieldSelector`` (:meth:`FakeDiscovery.field_labels`)
  are the apiserver's: ``metadata.name`` and ``metadata.namespace`` for every resource, the
  resource's own table where Kubernetes declares one (pods, events, secrets …; a cluster-scoped
  one there may serve no ``metadata.namespace``), a CRD's ``selectableFields``; a guessed or
  learned resource (its CRD never given) and events.k8s.io's Events serve any field.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping

from declop.errors import ConfigError
from declop.kube.discovery import ResourceInfo, resolve

__all__ = ["FakeDiscovery", "resources_of_crd"]

# --------------------------------------------------------------------------- known resources

# group, version, plural, kind, namespaced, short names, flags: s = status subresource, g = generation
_TABLE: tuple[tuple[str, str, str, str, bool, tuple[str, ...], str], ...] = (
    ("", "v1", "pods", "Pod", True, ("po",), "sg"),
    ("", "v1", "configmaps", "ConfigMap", True, ("cm",), ""),
    ("", "v1", "secrets", "Secret", True, (), ""),
    ("", "v1", "services", "Service", True, ("svc",), "s"),
    ("", "v1", "serviceaccounts", "ServiceAccount", True, ("sa",), ""),
    ("", "v1", "endpoints", "Endpoints", True, ("ep",), ""),
    ("", "v1", "events", "Event", True, ("ev",), ""),
    ("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True, ("pvc",), "s"),
    ("", "v1", "replicationcontrollers", "ReplicationController", True, ("rc",), "sg"),
    ("", "v1", "resourcequotas", "ResourceQuota", True, ("quota",), "s"),
    ("", "v1", "limitranges", "LimitRange", True, ("limits",), ""),
    ("", "v1", "podtemplates", "PodTemplate", True, (), ""),
    ("", "v1", "namespaces", "Namespace", False, ("ns",), "s"),
    ("", "v1", "nodes", "Node", False, ("no",), "s"),
    ("", "v1", "persistentvolumes", "PersistentVolume", False, ("pv",), "s"),
    ("apps", "v1", "deployments", "Deployment", True, ("deploy",), "sg"),
    ("apps", "v1", "statefulsets", "StatefulSet", True, ("sts",), "sg"),
    ("apps", "v1", "daemonsets", "DaemonSet", True, ("ds",), "sg"),
    ("apps", "v1", "replicasets", "ReplicaSet", True, ("rs",), "sg"),
    ("apps", "v1", "controllerrevisions", "ControllerRevision", True, (), ""),
    ("batch", "v1", "jobs", "Job", True, (), "sg"),
    ("batch", "v1", "cronjobs", "CronJob", True, ("cj",), "sg"),
    ("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler", True, ("hpa",), "sg"),
    ("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, ("pdb",), "sg"),
    ("networking.k8s.io", "v1", "ingresses", "Ingress", True, ("ing",), "sg"),
    ("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True, ("netpol",), "g"),
    ("networking.k8s.io", "v1", "ingressclasses", "IngressClass", False, (), ""),
    ("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", True, (), ""),
    ("events.k8s.io", "v1", "events", "Event", True, ("ev",), ""),
    ("coordination.k8s.io", "v1", "leases", "Lease", True, (), ""),
    ("rbac.authorization.k8s.io", "v1", "roles", "Role", True, (), ""),
    ("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True, (), ""),
    ("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False, (), ""),
    ("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False, (), ""),
    ("storage.k8s.io", "v1", "storageclasses", "StorageClass", False, ("sc",), ""),
    ("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False, ("pc",), ""),
    ("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False, ("crd", "crds"), "sg"),
    ("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations", "ValidatingWebhookConfiguration", False, (), "g"),
    ("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration", False, (), "g"),
)


def _info(group: str, version: str, plural: str, kind: str, namespaced: bool, short: tuple[str, ...], flags: str) -> ResourceInfo:
    return ResourceInfo(
        group=group,
        version=version,
        plural=plural,
        kind=kind,
        namespaced=namespaced,
        singular=kind.lower(),
        short_names=short,
        subresources=("status",) if "s" in flags else (),
    )


_BUILTIN: tuple[ResourceInfo, ...] = tuple(_info(*row) for row in _TABLE)
_GENERATION: frozenset[str] = frozenset(
    _info(*row).group_resource for row in _TABLE if "g" in row[6]
)


#: the field labels of ``fieldSelector`` each built-in serves, and the dotted path each reads
#: (Kubernetes' AddFieldLabelConversionFunc tables: pkg/apis/core/v1/conversion.go and the
#: apps/batch ones); a resource not here serves only :data:`_META` (the generic conversion)
_META = {"metadata.name": "metadata.name", "metadata.namespace": "metadata.namespace"}
_FIELD_LABELS: dict[str, dict[str, str]] = {
    "pods": {**_META, **{f: f for f in (
        "spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName", "spec.hostNetwork",
        "status.phase", "status.podIP", "status.podIPs", "status.nominatedNodeName")}, "spec.host": "spec.nodeName"},
    "nodes": {"metadata.name": "metadata.name", "spec.unschedulable": "spec.unschedulable"},
    "namespaces": {"metadata.name": "metadata.name", "status.phase": "status.phase"},
    "replicationcontrollers": {**_META, "status.replicas": "status.replicas"},
    "events": {**_META, **{f: f for f in (
        "involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
        "involvedObject.apiVersion", "involvedObject.resourceVersion", "involvedObject.fieldPath",
        "reason", "reportingComponent", "type")}, "source": "source.component"},
    "secrets": {**_META, "type": "type"},
    "services": {**_META, "spec.clusterIP": "spec.clusterIP", "spec.type": "spec.type"},
    "replicasets.apps": {**_META, "status.replicas": "status.replicas"},
    "jobs.batch": {**_META, "status.successful": "status.successful"},
}


def _pluralize(word: str) -> str:
    if word.endswith("y") and word[-2:-1] not in tuple("aeiou"):
        return word[:-1] + "ies"
    if word.endswith(("s", "x", "z", "ch", "sh")):
        return word + "es"
    return word + "s"


def _singularize(word: str) -> str:
    if word.endswith("ies"):
        return word[:-3] + "y"
    if word.endswith(("sses", "xes", "zes", "ches", "shes")):
        return word[:-2]
    return word.removesuffix("s")


def resources_of_crd(crd: Mapping[str, Any]) -> list[ResourceInfo]:
    """The resources a CustomResourceDefinition object serves (served versions, storage first)."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    versions = sorted(
        (v for v in spec.get("versions") or () if v.get("served", True)),
        key=lambda v: not v.get("storage", False),
    )
    return [
        ResourceInfo(
            group=spec["group"],
            version=v["name"],
            plural=names["plural"],
            kind=names["kind"],
            namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            singular=names.get("singular") or names["kind"].lower(),
            short_names=tuple(names.get("shortNames") or ()),
            subresources=("status",) if "status" in (v.get("subresources") or {}) else (),
        )
        for v in versions
    ]


class FakeDiscovery:
    """What the fake apiserver serves: built-ins, CRDs given, and guesses for the rest."""

    def __init__(self, extra: Iterable[ResourceInfo | Mapping[str, Any]] = ()) -> None:
        self._resources: list[ResourceInfo] = []
        self.generation: set[str] = set(_GENERATION)
        #: group_resource -> the field labels its CRD's ``selectableFields`` declare
        self._selectable: dict[str, dict[str, str]] = {}
        for r in extra:
            self.add(r)
        self._resources.extend(_BUILTIN)

    def add(self, r: ResourceInfo | Mapping[str, Any]) -> None:
        infos = [r] if isinstance(r, ResourceInfo) else resources_of_crd(r)
        for info in infos:
            if info not in self._resources:
                self._resources.insert(0, info)  # given resources win over the table
            if not isinstance(r, ResourceInfo) or info.group not in {b.group for b in _BUILTIN}:
                self.generation.add(info.group_resource)  # custom resources always have a generation
            if not isinstance(r, ResourceInfo):
                paths = [f.get("jsonPath") or "" for v in (r.get("spec") or {}).get("versions") or () for f in v.get("selectableFields") or ()]
                self._selectable[info.group_resource] = {**_META, **{p.lstrip("."): p.lstrip(".") for p in paths if p}}

    def field_labels(self, info: ResourceInfo) -> tuple[Mapping[str, str] | None, bool]:
        """The field labels ``info`` serves in a ``fieldSelector``, each with the dotted path of
        its value (None: any field, read at its own path — a resource whose CRD was never given),
        and whether the resource has a table of its own (the apiserver words a refusal
        differently then)."""
        gr = info.group_resource
        if gr in self._selectable:
            return self._selectable[gr], False
        if gr in _FIELD_LABELS:
            return _FIELD_LABELS[gr], True
        if gr != "events.events.k8s.io" and any(b.group_resource == gr for b in _BUILTIN):
            return _META, False
        return None, False

    def resources(self) -> list[ResourceInfo]:
        return list(self._resources)

    def resolve_cached(self, name: str) -> ResourceInfo:
        try:
            return resolve(name, self._resources)
        except ConfigError:
            guess = self._guess(name)
            if guess is None:
                raise ConfigError(
                    f"the fake apiserver does not know {name!r}; pass resources=[ResourceInfo(...) or the CRD "
                    "object], or seed an object of that kind"
                ) from None
            self.add(guess)
            return guess

    async def resolve(self, name: str) -> ResourceInfo:
        return self.resolve_cached(name)

    @staticmethod
    def _guess(name: str) -> ResourceInfo | None:
        word, dot, rest = name.strip().lower().partition(".")
        if not dot or "." not in rest and not rest.startswith("v"):
            return None
        version, _, group = rest.partition(".")
        if not (version[:1] == "v" and version[1:2].isdigit()):
            version, group = "v1", rest
        if not group or "." not in group:
            return None
        plural = word if word.endswith("s") else _pluralize(word)
        kind = _singularize(plural).capitalize()
        return ResourceInfo(group, version, plural, kind, True, singular=kind.lower(), subresources=("status",))

    def learn(self, obj: Mapping[str, Any]) -> ResourceInfo | None:
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if not api_version or not kind:
            return None
        group, _, version = str(api_version).rpartition("/")
        for r in self._resources:
            if r.kind == kind and r.group == group and r.version == version:
                return r
        for r in self._resources:  # another version of a known kind
            if r.kind == kind and r.group == group:
                info = dataclasses.replace(r, version=version)
                self.add(info)
                return info
        namespaced = bool((obj.get("metadata") or {}).get("namespace"))
        info = ResourceInfo(
            group, version, _pluralize(str(kind).lower()), str(kind), namespaced,
            singular=str(kind).lower(), subresources=("status",),
        )
        self.add(info)
        self.generation.add(info.group_resource)
        return info
