"""The scaffold behind ``declop new``: a small operator project for one custom resource.

``declop new Widget --group example.com`` writes, into a new folder:

- ``handlers.py`` — the kind as a typed model (``Widget``, a :class:`declop.CustomResource`:
  spec with a required, bounded ``message`` and a defaulted ``key``; status with
  ``observedGeneration`` and ``conditions``) and a reconciler taking ``obj: Widget`` with a
  finalizer, an owned ConfigMap built from the spec (:func:`declop.create_or_update`,
  :func:`declop.set_controller_reference`) and a ``Ready`` condition written with the typed
  ``client.patch_status``. There is no CRD file: ``declop crd handlers.py`` prints it from the
  model and ``declop dev handlers.py`` applies it;
- ``rbac-values.yaml`` — what ``declop rbac handlers.py --values rbac-values.yaml`` writes, made
  here by the same code (:func:`rbac_values`) from the handlers just written, so a fresh project's
  chart installs with exactly the RBAC its handlers need and nothing typed by hand;
- ``Dockerfile`` (and ``.dockerignore``) — the project's image ``FROM declop:<version>``: what
  ``declop dev --node`` runs as the chart's Pod, and what a cluster runs;
- ``example.yaml``, ``tests/test_handlers.py`` (unit, fake apiserver),
  ``tests/test_integration.py`` (the pytest plugin's real control plane), ``values.yaml`` (the
  Helm chart's other values), ``README.md``, ``pyproject.toml`` (pytest settings) and ``.gitignore``.

The templates are package data (``declop/dev/templates/operator/*.tmpl``, read through
:mod:`importlib.resources`, so an installed wheel has them) filled with :class:`string.Template`
(``${kind}``, ``${plural}`` …): the Python and YAML in them keep their braces.

Invariants:

- every name is checked before anything is written, each with one line saying what is wrong
  and what would do (:class:`ScaffoldError`, a :class:`~declop.errors.ConfigError`);
- nothing is written into a folder that exists and is not empty;
- the plural is not a name kubectl resolves to a built-in resource (:data:`BUILTIN_RESOURCES`:
  plural, singular or short name — ``cronjobs``, ``cm``): kubectl would list the built-in one; a
  singular that is such a name is allowed with a warning (:func:`warnings_for`), since the
  project's commands use the plural;
- the Kind is not a name ``handlers.py`` imports (``BaseModel``, ``Field`` …: the model class
  would shadow it);
- the names follow the CRD rules: ``plural``/``singular`` are lowercase DNS labels, the CRD is
  named ``<plural>.<group>``, the list kind is ``<Kind>List``;
- generating ``rbac-values.yaml`` leaves the caller's process as it was: the handlers are executed
  into a registry of their own, and no module of theirs stays in :data:`sys.modules`.
"""

from __future__ import annotations

import keyword
import re
import runpy
import string
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from declop import registry as registry_module
from declop.errors import ConfigError
from declop.kube.catalog import Catalog
from declop.kube.rbac import values_yaml
from declop.version import __version__

__all__ = [
    "BUILTIN_RESOURCES", "Names", "RBAC_VALUES", "ScaffoldError", "builtin_named", "create", "names_for", "plural_of",
    "rbac_values", "render", "warnings_for",
]  # fmt: skip

_KIND = re.compile(r"^[A-Z][A-Za-z0-9]*$")
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN_PART = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_GROUP = re.compile(rf"^{_DNS_SUBDOMAIN_PART}(\.{_DNS_SUBDOMAIN_PART})+$")
_VERSION = re.compile(r"^v[1-9][0-9]*((alpha|beta)[1-9][0-9]*)?$")
_LABEL_MAX = 63
_SUBDOMAIN_MAX = 253
#: groups whose CRDs the apiserver accepts only with an api-approved.kubernetes.io annotation
_PROTECTED = ("k8s.io", "kubernetes.io")
#: singular names that cannot be the Python name of the handler and its argument
_RESERVED = frozenset(keyword.kwlist) | frozenset(keyword.softkwlist) | {
    # names the generated modules use at their top level or around the handler's argument
    "declop", "handlers", "yaml", "pytest", "kubernetes", "logging", "crd", "read", "ready",
    "configmap", "meta", "spec", "status", "mutate", "datetime", "pydantic", "typing", "definitions", "obj",
    "owner", "generation", "conditions", "request", "client", "logger", "phase",
}
#: Kinds that cannot be the model's class name: handlers.py imports these names
_RESERVED_KINDS = frozenset({"BaseModel", "Field", "Annotated", "Literal", "Column", "ListType"})
#: the file rbac_values fills, and the command that regenerates it
RBAC_VALUES = "rbac-values.yaml"
RBAC_COMMAND = "declop rbac handlers.py"
#: Kubernetes' built-in resources as kubectl knows them: group-resource → (singular, short names).
#: kubectl resolves a name to a built-in resource before any custom one, so a custom resource
#: whose plural is one of these names is out of reach by its short name (``kubectl get cronjobs``
#: lists batch's). Offline on purpose (``declop new`` needs no cluster); a test compares it with
#: the discovery of declop's test apiserver, so a new Kubernetes version cannot leave it behind.
BUILTIN_RESOURCES: dict[str, tuple[str, tuple[str, ...]]] = {
    "bindings": ("binding", ()),
    "componentstatuses": ("componentstatus", ("cs",)),
    "configmaps": ("configmap", ("cm",)),
    "endpoints": ("endpoints", ("ep",)),
    "events": ("event", ("ev",)),
    "limitranges": ("limitrange", ("limits",)),
    "namespaces": ("namespace", ("ns",)),
    "nodes": ("node", ("no",)),
    "persistentvolumeclaims": ("persistentvolumeclaim", ("pvc",)),
    "persistentvolumes": ("persistentvolume", ("pv",)),
    "pods": ("pod", ("po",)),
    "podtemplates": ("podtemplate", ()),
    "replicationcontrollers": ("replicationcontroller", ("rc",)),
    "resourcequotas": ("resourcequota", ("quota",)),
    "secrets": ("secret", ()),
    "serviceaccounts": ("serviceaccount", ("sa",)),
    "services": ("service", ("svc",)),
    "mutatingwebhookconfigurations.admissionregistration.k8s.io": ("mutatingwebhookconfiguration", ()),
    "validatingwebhookconfigurations.admissionregistration.k8s.io": ("validatingwebhookconfiguration", ()),
    "validatingadmissionpolicies.admissionregistration.k8s.io": ("validatingadmissionpolicy", ()),
    "validatingadmissionpolicybindings.admissionregistration.k8s.io": ("validatingadmissionpolicybinding", ()),
    "mutatingadmissionpolicies.admissionregistration.k8s.io": ("mutatingadmissionpolicy", ()),
    "mutatingadmissionpolicybindings.admissionregistration.k8s.io": ("mutatingadmissionpolicybinding", ()),
    "customresourcedefinitions.apiextensions.k8s.io": ("customresourcedefinition", ("crd", "crds")),
    "apiservices.apiregistration.k8s.io": ("apiservice", ()),
    "controllerrevisions.apps": ("controllerrevision", ()),
    "daemonsets.apps": ("daemonset", ("ds",)),
    "deployments.apps": ("deployment", ("deploy",)),
    "replicasets.apps": ("replicaset", ("rs",)),
    "statefulsets.apps": ("statefulset", ("sts",)),
    "selfsubjectreviews.authentication.k8s.io": ("selfsubjectreview", ()),
    "tokenreviews.authentication.k8s.io": ("tokenreview", ()),
    "localsubjectaccessreviews.authorization.k8s.io": ("localsubjectaccessreview", ()),
    "selfsubjectaccessreviews.authorization.k8s.io": ("selfsubjectaccessreview", ()),
    "selfsubjectrulesreviews.authorization.k8s.io": ("selfsubjectrulesreview", ()),
    "subjectaccessreviews.authorization.k8s.io": ("subjectaccessreview", ()),
    "horizontalpodautoscalers.autoscaling": ("horizontalpodautoscaler", ("hpa",)),
    "cronjobs.batch": ("cronjob", ("cj",)),
    "jobs.batch": ("job", ()),
    "certificatesigningrequests.certificates.k8s.io": ("certificatesigningrequest", ("csr",)),
    "clustertrustbundles.certificates.k8s.io": ("clustertrustbundle", ()),
    "podcertificaterequests.certificates.k8s.io": ("podcertificaterequest", ()),
    "leases.coordination.k8s.io": ("lease", ()),
    "leasecandidates.coordination.k8s.io": ("leasecandidate", ()),
    "endpointslices.discovery.k8s.io": ("endpointslice", ()),
    "events.events.k8s.io": ("event", ("ev",)),
    "flowschemas.flowcontrol.apiserver.k8s.io": ("flowschema", ()),
    "prioritylevelconfigurations.flowcontrol.apiserver.k8s.io": ("prioritylevelconfiguration", ()),
    "storageversions.internal.apiserver.k8s.io": ("storageversion", ()),
    "ingressclasses.networking.k8s.io": ("ingressclass", ()),
    "ingresses.networking.k8s.io": ("ingress", ("ing",)),
    "ipaddresses.networking.k8s.io": ("ipaddress", ("ip",)),
    "networkpolicies.networking.k8s.io": ("networkpolicy", ("netpol",)),
    "servicecidrs.networking.k8s.io": ("servicecidr", ()),
    "runtimeclasses.node.k8s.io": ("runtimeclass", ()),
    "poddisruptionbudgets.policy": ("poddisruptionbudget", ("pdb",)),
    "clusterrolebindings.rbac.authorization.k8s.io": ("clusterrolebinding", ()),
    "clusterroles.rbac.authorization.k8s.io": ("clusterrole", ()),
    "rolebindings.rbac.authorization.k8s.io": ("rolebinding", ()),
    "roles.rbac.authorization.k8s.io": ("role", ()),
    "deviceclasses.resource.k8s.io": ("deviceclass", ()),
    "devicetaintrules.resource.k8s.io": ("devicetaintrule", ()),
    "resourceclaims.resource.k8s.io": ("resourceclaim", ()),
    "resourceclaimtemplates.resource.k8s.io": ("resourceclaimtemplate", ()),
    "resourceslices.resource.k8s.io": ("resourceslice", ()),
    "priorityclasses.scheduling.k8s.io": ("priorityclass", ("pc",)),
    "csidrivers.storage.k8s.io": ("csidriver", ()),
    "csinodes.storage.k8s.io": ("csinode", ()),
    "csistoragecapacities.storage.k8s.io": ("csistoragecapacity", ()),
    "storageclasses.storage.k8s.io": ("storageclass", ("sc",)),
    "volumeattachments.storage.k8s.io": ("volumeattachment", ()),
    "volumeattributesclasses.storage.k8s.io": ("volumeattributesclass", ("vac",)),
    "storageversionmigrations.storagemigration.k8s.io": ("storageversionmigration", ()),
}  # fmt: skip


def builtin_named(name: str) -> str | None:
    """The built-in resource (``"cronjobs.batch"``) kubectl finds for ``name`` — a plural, a
    singular or a short name — or ``None``."""
    for group_resource, (singular, short) in BUILTIN_RESOURCES.items():
        if name in (group_resource.partition(".")[0], singular, *short):
            return group_resource
    return None


TEMPLATES = "dev/templates/operator"
SUFFIX = ".tmpl"


class ScaffoldError(ConfigError):
    """A name or a target folder ``declop new`` cannot use; a usage error (exit code 2)."""

    exit_code = 2


@dataclass(frozen=True)
class Names:
    """Every name of the generated resource, derived from Kind, group and version."""

    kind: str
    group: str
    version: str
    plural: str
    singular: str

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def crd_name(self) -> str:
        """``widgets.example.com``: also the resource name a reconciler registers."""
        return f"{self.plural}.{self.group}"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @property
    def finalizer(self) -> str:
        return f"{self.crd_name}/cleanup"

    @property
    def python_name(self) -> str:
        """The handler's name and its argument's: the singular, unless Python or the template needs it."""
        return f"{self.singular}_" if self.singular in _RESERVED else self.singular

    @property
    def project(self) -> str:
        """The default folder and Helm release name: ``widget-operator``."""
        return f"{self.singular}-operator"

    def substitutions(self) -> dict[str, str]:
        return {
            "kind": self.kind,
            "group": self.group,
            "version": self.version,
            "plural": self.plural,
            "singular": self.singular,
            "list_kind": self.list_kind,
            "crd_name": self.crd_name,
            "resource": self.crd_name,
            "api_version": self.api_version,
            "finalizer": self.finalizer,
            "var": self.python_name,
            "project": self.project,
        }


def plural_of(kind: str) -> str:
    """The lowercase plural of a Kind, by the English rules Kubernetes' generators use.

    ``Widget`` → ``widgets``, ``Policy`` → ``policies``, ``Ingress`` → ``ingresses``,
    ``Box`` → ``boxes``, ``Gateway`` → ``gateways``. Irregular words need ``--plural``.
    """
    word = kind.lower()
    if word.endswith("y") and word[-2:-1] not in ("a", "e", "i", "o", "u", ""):
        return word[:-1] + "ies"
    if word.endswith(("s", "x", "z", "ch", "sh")):
        return word + "es"
    return word + "s"


def check_kind(kind: str) -> str:
    if not _KIND.match(kind):
        hint = "".join(part[:1].upper() + part[1:] for part in re.split(r"[^A-Za-z0-9]+", kind))
        raise ScaffoldError(
            f"Kind {kind!r} is not CamelCase: start with an upper-case letter, then letters and digits "
            f"only (e.g. {hint if _KIND.match(hint) else 'Widget'})"
        )
    if len(kind) > _LABEL_MAX:
        raise ScaffoldError(f"Kind {kind!r} is {len(kind)} characters long; at most {_LABEL_MAX} fit a resource name")
    if kind in _RESERVED_KINDS:
        raise ScaffoldError(f"Kind {kind!r} is a name the generated handlers.py imports (from pydantic or declop); choose another")
    if kind.endswith("List"):
        raise ScaffoldError(f"Kind {kind!r} ends in 'List', which Kubernetes keeps for lists ({kind}List); choose another")
    return kind


def check_group(group: str) -> str:
    if not _GROUP.match(group) or len(group) > _SUBDOMAIN_MAX:
        raise ScaffoldError(
            f"group {group!r} is not a DNS subdomain with a dot: use a domain you own, lowercase, e.g. example.com "
            "or widgets.mycompany.io"
        )
    if any(group == p or group.endswith("." + p) for p in _PROTECTED):
        raise ScaffoldError(
            f"group {group!r} is reserved for Kubernetes' own APIs (the apiserver wants an api-approved "
            "annotation); use a domain you own, e.g. example.com"
        )
    return group


def check_version(version: str) -> str:
    if not _VERSION.match(version):
        raise ScaffoldError(
            f"version {version!r} is not a Kubernetes API version: v1, v2, v1alpha1, v2beta3 … (v, a number, "
            "then optionally alpha/beta and a number)"
        )
    return version


def check_plural(plural: str, singular: str) -> str:
    if not _DNS_LABEL.match(plural) or len(plural) > _LABEL_MAX:
        raise ScaffoldError(
            f"plural {plural!r} must be lowercase letters, digits and '-', starting with a letter "
            f"(a DNS label of at most {_LABEL_MAX} characters), e.g. {singular}s"
        )
    if plural == singular:
        raise ScaffoldError(f"plural {plural!r} is the same as the singular; give a different --plural")
    return plural


def names_for(kind: str, group: str, version: str = "v1", plural: str | None = None) -> Names:
    """Check and derive every name; raises :class:`ScaffoldError` (one line) on the first bad one."""
    check_kind(kind)
    check_group(group)
    check_version(version)
    singular = kind.lower()
    plural = check_plural(plural if plural is not None else plural_of(kind), singular)
    clash = builtin_named(plural)
    if clash is not None:
        raise ScaffoldError(
            f"plural {plural!r} is also a name of the built-in {clash}: `kubectl get {plural}` would list that, "
            f"not yours; give another Kind, or --plural with a name of your own (e.g. --plural {group.split('.')[0]}{plural})"
        )
    names = Names(kind=kind, group=group, version=version, plural=plural, singular=singular)
    if len(names.crd_name) > _SUBDOMAIN_MAX:
        raise ScaffoldError(
            f"the CRD name {names.crd_name!r} is longer than {_SUBDOMAIN_MAX} characters; shorten the group or the plural"
        )
    return names


def warnings_for(names: Names) -> list[str]:
    """What is allowed but will surprise: a singular (the Kind in lower case) that kubectl
    resolves to a built-in resource first. One line each; ``declop new`` prints them."""
    clash = builtin_named(names.singular)
    if clash is None:
        return []
    return [
        f"`kubectl get {names.singular}` lists the built-in {clash}, not your {names.kind}: use "
        f"`kubectl get {names.plural}` or `kubectl get {names.crd_name}` (or give another Kind)"
    ]


def _templates() -> Traversable:
    return resources.files("declop").joinpath(TEMPLATES)


def _walk(folder: Traversable, prefix: str = "") -> list[tuple[str, Traversable]]:
    out: list[tuple[str, Traversable]] = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.is_dir():
            out.extend(_walk(entry, f"{prefix}{entry.name}/"))
        elif entry.name.endswith(SUFFIX):
            out.append((prefix + entry.name, entry))
    return out


def _target_name(template_path: str) -> str:
    """``tests/test_handlers.py.tmpl`` → ``tests/test_handlers.py``; ``_gitignore.tmpl`` → ``.gitignore``."""
    path = template_path.removesuffix(SUFFIX)
    head, _, name = path.rpartition("/")
    if name.startswith("_"):
        name = "." + name[1:]
    return f"{head}/{name}" if head else name


def render(names: Names) -> dict[str, str]:
    """The project's files: relative path → content, sorted by path."""
    values = {**names.substitutions(), "declop_version": __version__}
    files = {
        _target_name(path): string.Template(entry.read_text(encoding="utf-8")).substitute(values)
        for path, entry in _walk(_templates())
    }
    files = dict(sorted(files.items()))
    if not files:
        raise RuntimeError(f"declop's scaffold templates are missing from {_templates()}: reinstall declop")
    return files


def create(names: Names, directory: str | Path | None = None) -> tuple[Path, list[Path]]:
    """Write the project into ``directory`` (default ``./<singular>-operator``); return it and the files.

    Raises:
        ScaffoldError: the folder exists and is not empty, or is a file.
    """
    target = Path(directory if directory is not None else names.project)
    if target.exists():
        if not target.is_dir():
            raise ScaffoldError(f"{target} is a file; give --dir a new or empty folder")
        if any(target.iterdir()):
            raise ScaffoldError(f"{target} exists and is not empty; give --dir a new or empty folder")
    files = render(names)
    written = []
    for relative, content in files.items():
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
        written.append(path)
    rbac = target / RBAC_VALUES
    rbac.write_text(rbac_values(target / "handlers.py"), encoding="utf-8")
    written.append(rbac)
    return target, sorted(written, key=lambda p: p.relative_to(target).as_posix())


def rbac_values(handlers: str | Path) -> str:
    """What ``declop rbac handlers.py --values rbac-values.yaml`` writes for the file ``handlers``.

    The file is executed (as ``declop rbac`` loads it) with a registry of its own standing in for
    declop's default one, so its ``@declop.reconciler`` lands there and the caller's registrations
    are untouched; the grants go through :func:`declop.kube.rbac.values_yaml`, as the command's do,
    names and scopes read as ``declop rbac --offline`` reads them (the typed model's own scope).
    """
    own = registry_module.Registry()
    saved, registry_module.default_registry = registry_module.default_registry, own
    try:
        runpy.run_path(str(handlers), run_name="declop_scaffold_handlers")
    finally:
        registry_module.default_registry = saved
    names = Catalog.standard()
    grants = own.grants(names.resolve, cluster_scoped=names.cluster_scoped)
    return values_yaml(grants, webhooks=bool(own.webhooks), command=RBAC_COMMAND)
