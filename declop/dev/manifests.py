"""Manifests: YAML files applied to a cluster before the operator starts (``declop dev -f``).

Owns reading the files, applying their objects and waiting until the CRDs among them serve.

- :func:`read` takes files or folders (a folder gives its ``*.yaml``, ``*.yml`` and ``*.json``
  files, sorted, not recursively); a file may hold many documents; ``kind: List`` is expanded;
  empty documents are skipped. Each object remembers its file, for messages.
- :func:`apply` applies with **server-side apply** (field manager ``declop-dev``, ``force``):
  one idempotent request per object, no resourceVersion to carry, so applying the same files
  again after an edit is safe; a field deleted from the file is removed from the object (the
  field manager owned it), while what others own — the operator's ``status``, its finalizers
  and labels — is left alone, which a create-or-replace would wipe. ``force`` takes the fields
  over from a ``kubectl edit`` made meanwhile: in development the file is the truth.
- Order: CustomResourceDefinitions first, then Namespaces, then the rest — and the rest only
  once every CRD is ``Established`` and its resource is served by discovery, so a file may hold
  a CRD and objects of its kind.

:func:`from_models` gives the CRDs of the :class:`~declop.typed.model.CustomResource` models of
loaded handler modules (and of the registrations) as manifests, which ``declop crd`` prints and
``declop dev`` applies like ``-f`` files.

Invariant: every failure is one :class:`~declop.errors.ConfigError` line naming the file and
the object (``crd.yaml: CustomResourceDefinition greetings.hello.example.org: …``) or, for a
CRD that does not become Established in time, the CRD, the time waited and its last condition.
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Awaitable, Iterable, Mapping, Protocol

import yaml  # type: ignore[import-untyped]

from declop.kube.discovery import Discovery, ResourceInfo
from declop.errors import ApiError, ConfigError
from declop.registry import Registry
from declop.typed.crd import crd_name_of, definitions, models_in
from declop.webhooks.configuration import conversion_client_config

__all__ = ["CRD_TIMEOUT", "FIELD_MANAGER", "Manifest", "apply", "from_models", "read"]

#: the field manager of objects applied from ``-f`` files
FIELD_MANAGER = "declop-dev"

#: seconds a CRD may take to become Established and served
CRD_TIMEOUT = 30.0

_EXTENSIONS = (".yaml", ".yml", ".json")
_CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
_APPLY = "application/apply-patch+yaml"
_POLL = 0.05


class Requester(Protocol):
    """What :func:`apply` needs of a :class:`~declop.kube.transport.Transport`."""

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str | None = None,
    ) -> Awaitable[Any]: ...


@dataclass(frozen=True, slots=True)
class Manifest:
    """One object read from a file. ``str()`` names it as messages do: ``file: Kind ns/name``."""

    file: str
    obj: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.obj.get("kind") or "")

    @property
    def api_version(self) -> str:
        return str(self.obj.get("apiVersion") or "")

    @property
    def name(self) -> str:
        return str((self.obj.get("metadata") or {}).get("name") or "")

    @property
    def namespace(self) -> str:
        return str((self.obj.get("metadata") or {}).get("namespace") or "")

    @property
    def is_crd(self) -> bool:
        return self.kind == "CustomResourceDefinition" and self.api_version.startswith("apiextensions.k8s.io/")

    def __str__(self) -> str:
        key = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.file}: {self.kind} {key}"


def _one_line(text: str) -> str:
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


def _files(path: str) -> list[str]:
    if os.path.isdir(path):
        found = sorted(
            os.path.join(path, f)
            for f in os.listdir(path)
            if f.endswith(_EXTENSIONS) and not f.startswith(".") and os.path.isfile(os.path.join(path, f))
        )
        if not found:
            raise ConfigError(f"no .yaml, .yml or .json files in folder {path}")
        return found
    if not os.path.exists(path):
        raise ConfigError(f"no such file: {path}; -f takes a YAML file or a folder of them")
    return [path]


def _objects(file: str, document: int, doc: Any) -> list[Manifest]:
    where = f"{file}, document {document}"
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: expected a Kubernetes object (a mapping), got {type(doc).__name__}")
    if doc.get("kind") == "List" or (str(doc.get("kind", "")).endswith("List") and isinstance(doc.get("items"), list)):
        return [m for item in doc.get("items") or () for m in _objects(file, document, item)]
    missing = [f for f, v in (("apiVersion", doc.get("apiVersion")), ("kind", doc.get("kind")),
                              ("metadata.name", (doc.get("metadata") or {}).get("name"))) if not v]
    if missing:
        raise ConfigError(f"{where}: the object has no {', '.join(missing)}; every manifest needs apiVersion, kind and metadata.name")
    return [Manifest(file, doc)]


def read(paths: Iterable[str]) -> list[Manifest]:
    """Every object in ``paths`` (files or folders), in order.

    Raises:
        ConfigError: a missing path, an empty folder, YAML that does not parse (file and line),
            a document that is not an object with apiVersion, kind and metadata.name.
    """
    manifests: list[Manifest] = []
    for path in paths:
        for file in _files(path):
            try:
                with open(file, encoding="utf-8") as f:
                    docs = list(yaml.safe_load_all(f))
            except yaml.MarkedYAMLError as exc:
                mark = exc.problem_mark
                line = f":{mark.line + 1}" if mark is not None else ""
                raise ConfigError(f"{file}{line}: not valid YAML: {exc.problem or exc}") from exc
            except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
                raise ConfigError(f"cannot read {file}: {_one_line(str(exc))}") from exc
            for number, doc in enumerate(docs, 1):
                if doc is not None:
                    manifests.extend(_objects(file, number, doc))
    return manifests


def from_models(
    modules: Iterable[ModuleType],
    registry: Registry,
    *,
    webhook_service: str | None = None,
    webhook_url: str | None = None,
    webhook_port: int = 9443,
) -> list[Manifest]:
    """The CRDs of the models defined in or imported into ``modules`` and of those the
    ``registry``'s registrations name, one :class:`Manifest` each (its file: the module that
    defines the model). A kind with a ``@declop.converter`` gets ``spec.conversion`` pointing
    where the operator will serve it with the same ``--webhook-*`` options (the operator adds
    the ``caBundle`` when it starts).

    Raises:
        ConfigError: a model the CRD cannot be made of (one line naming the model and field).
    """
    models = models_in(modules, *registry.registrations, *registry.webhooks)
    conversions: dict[str, dict[str, Any]] = {}
    for hook in registry.webhooks:
        crd = crd_name_of(hook.resource, models) if hook.kind == "converter" else None
        if crd is not None:
            conversions[crd] = conversion_client_config(hook, service=webhook_service, url=webhook_url, port=webhook_port)
    files = {m.kind_of().crd_name: str(getattr(sys.modules.get(m.__module__), "__file__", None) or m.__module__) for m in models}
    return [Manifest(_short(files[crd["metadata"]["name"]]), crd) for crd in definitions(models, conversions=conversions)]


def _short(path: str) -> str:
    relative = os.path.relpath(path) if os.path.isabs(path) else path
    return relative if not relative.startswith("..") else path


def _order(manifest: Manifest) -> int:
    if manifest.is_crd:
        return 0
    return 1 if manifest.kind == "Namespace" and manifest.api_version == "v1" else 2


async def apply(
    manifests: Iterable[Manifest],
    transport: Requester,
    discovery: Discovery,
    *,
    field_manager: str = FIELD_MANAGER,
    timeout: float = CRD_TIMEOUT,
) -> list[Manifest]:
    """Server-side apply ``manifests`` — CRDs, then Namespaces, then the rest once every CRD is
    Established and served — and return them in the order applied.

    Raises:
        ConfigError: the apiserver refused an object (its file, kind, name and the apiserver's
            message), serves no such kind, or a CRD did not become Established and served
            within ``timeout`` seconds.
    """
    ordered = sorted(manifests, key=_order)
    crds = [m for m in ordered if m.is_crd]
    for manifest in crds:
        await _apply_one(manifest, _crd_info(), transport, field_manager)
    if crds:
        await wait_established(crds, transport, discovery, timeout=timeout)
    elif any(not m.is_crd for m in ordered):
        await discovery.refresh()
    for manifest in ordered:
        if not manifest.is_crd:
            await _apply_one(manifest, _resolve(manifest, discovery), transport, field_manager)
    return ordered


def _crd_info() -> ResourceInfo:
    return ResourceInfo("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False)


def _resolve(manifest: Manifest, discovery: Discovery) -> ResourceInfo:
    group, _, version = manifest.api_version.rpartition("/")
    for r in discovery.resources():
        if r.kind == manifest.kind and r.group == group and r.version == version:
            return r
    raise ConfigError(
        f"{manifest}: the apiserver serves no kind {manifest.kind} in {manifest.api_version}; "
        "check apiVersion and kind, or add the file with its CustomResourceDefinition to -f"
    )


async def _apply_one(manifest: Manifest, info: ResourceInfo, transport: Requester, field_manager: str) -> None:
    namespace = (manifest.namespace or "default") if info.namespaced else None
    body = manifest.obj
    if info.namespaced and not manifest.namespace:
        body = {**body, "metadata": {**body["metadata"], "namespace": namespace}}
    try:
        await transport.request(
            "PATCH",
            info.path(namespace, manifest.name),
            params={"fieldManager": field_manager, "force": "true"},
            body=body,
            content_type=_APPLY,
        )
    except ApiError as exc:
        raise ConfigError(f"{manifest}: the apiserver refused it: {_one_line(str(exc))}") from exc


async def wait_established(
    crds: Iterable[Manifest], transport: Requester, discovery: Discovery, *, timeout: float = CRD_TIMEOUT
) -> None:
    """Wait until every CRD has ``Established=True`` and discovery serves its resource.

    Raises:
        ConfigError: a CRD's names were not accepted (at once, with the apiserver's reason), or
            ``timeout`` seconds passed (naming the CRD and its last conditions).
    """
    crds = list(crds)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    pending = list(crds)
    conditions: dict[str, Any] = {}
    while pending:
        still: list[Manifest] = []
        for crd in pending:
            current = await transport.request("GET", f"{_CRD_PATH}/{crd.name}")
            found = {c.get("type"): c for c in ((current or {}).get("status") or {}).get("conditions") or ()}
            conditions[crd.name] = found
            names = found.get("NamesAccepted")
            if names is not None and names.get("status") == "False":
                raise ConfigError(f"{crd}: its names were not accepted: {_one_line(names.get('message') or names.get('reason') or '')}")
            if (found.get("Established") or {}).get("status") != "True":
                still.append(crd)
        pending = still
        if not pending:
            break
        if loop.time() > deadline:
            raise _timed_out(pending[0], timeout, conditions.get(pending[0].name) or {})
        await asyncio.sleep(_POLL)
    served = [_served(crd) for crd in crds]
    while True:
        await discovery.refresh()
        have = {(r.group, r.plural) for r in discovery.resources()}
        missing = [crd for crd, wanted in zip(crds, served) if wanted not in have]
        if not missing:
            return
        if loop.time() > deadline:
            raise ConfigError(
                f"{missing[0]}: Established, but discovery still does not serve {'.'.join(reversed(_served(missing[0])))} "
                f"after {timeout:g} s; is a version marked served: true?"
            )
        await asyncio.sleep(_POLL)


def _served(crd: Manifest) -> tuple[str, str]:
    spec = crd.obj.get("spec") or {}
    return str(spec.get("group") or ""), str((spec.get("names") or {}).get("plural") or "")


def _timed_out(crd: Manifest, timeout: float, conditions: Mapping[str, Any]) -> ConfigError:
    if conditions:
        state = "; ".join(
            f"{t}={c.get('status')}" + (f" ({_one_line(c.get('message'))})" if c.get("message") else "")
            for t, c in conditions.items()
        )
    else:
        state = "no conditions yet"
    return ConfigError(f"{crd}: not Established after {timeout:g} s ({state}); check the CRD with kubectl describe crd {crd.name}")
