"""Webhook configuration: the objects that tell the apiserver to call this operator.

At start the manager applies (server-side apply, field manager ``declop-webhooks``, forced —
the operator owns them) one ``ValidatingWebhookConfiguration`` and one
``MutatingWebhookConfiguration`` named ``--webhook-name`` holding every validator and mutator,
and sets ``spec.conversion`` of each CRD that has a converter. Every replica applies the same
objects (same CA, same Service or URL), so a rollout changes nothing.

Each webhook entry has (docs/webhooks.md):

- ``rules``: the resource as discovery resolved it (``widgets``: the main resource only; with
  ``subresource=`` ``widgets/status`` … instead; ``widgets/*`` matches the main resource and
  every subresource), all versions (``apiVersions: ["*"]``, so
  ``matchPolicy: Equivalent`` covers every version) — for a typed validator or mutator
  (``obj: Widget``) its model's version only, to which the apiserver converts an object written
  at another — the decorator's operations, the scope;
- ``clientConfig``: ``service`` (namespace, name, port, path) with ``--webhook-service``,
  else ``url`` (``--webhook-url`` + path), and the ``caBundle``;
- ``sideEffects: None``, ``admissionReviewVersions: ["v1"]``, ``failurePolicy`` and
  ``timeoutSeconds`` from the decorator, an ``objectSelector`` from ``labels=``;
- a ``namespaceSelector`` (``kubernetes.io/metadata.name NotIn [...]``) that excludes
  ``kube-system``, ``kube-public`` and ``kube-node-lease`` (unless the decorator says
  ``system_namespaces=True``): a ``Fail`` webhook that is down must not block CoreDNS, the CNI's
  Pods or node heartbeats, which the cluster needs to bring the operator back; and the
  operator's own namespace, so a broken operator can always be repaired (its Deployment, its CA
  Secret) without its own webhooks in the way — when that namespace is known
  (``--webhook-namespace``, the Service's, the Pod's; out of a cluster there is none). For a
  Namespace object the selector reads the Namespace's own labels (so ``kube-system`` itself is
  skipped too); other cluster-scoped objects are always sent.

Both configurations are applied on every start, an empty one too: an entry of a handler that
was removed since the last start disappears with the next apply (a stale entry with
``failurePolicy: Fail`` would block writes). A CRD keeps ``spec.conversion`` when its converter
is removed: declop cannot tell it set it; set ``strategy: None`` by hand.

Invariants: these functions build dicts and send requests; no configuration is ever deleted
by declop (a stopped operator with ``failurePolicy: Fail`` blocks writes to its resources — that
is what Fail means; see the docs for removing them). The chart creates both configurations,
empty, as objects of its release, so ``helm uninstall`` removes them with the operator; the
apply only fills in ``webhooks`` (Helm never set that field, so an upgrade leaves it alone).
The chart grants ``patch`` on that name and no ``create``: an apply to a configuration that is
not there (deleted by hand) is refused, and the error says to ``helm upgrade`` (out of the chart,
the apply creates it where ``create`` is granted).
"""

from __future__ import annotations

import base64
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from declop.kube.discovery import ResourceInfo
from declop.errors import ApiError, ConfigError
from declop.kube.labels import parse_selector
from declop.webhooks.declaration import SYSTEM_NAMESPACES, Webhook

__all__ = [
    "ClientConfig", "FIELD_MANAGER", "apply_configurations", "configuration", "conversion_client_config", "conversion_patch",
    "parse_service",
]

log = logging.getLogger("declop.webhook")

FIELD_MANAGER = "declop-webhooks"
ADMISSION_API = "admissionregistration.k8s.io/v1"
_KINDS = {"validator": "ValidatingWebhookConfiguration", "mutator": "MutatingWebhookConfiguration"}
_PLURALS = {"validator": "validatingwebhookconfigurations", "mutator": "mutatingwebhookconfigurations"}

Request = Callable[..., Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """How the apiserver reaches the webhook server: a Service, else a base URL."""

    ca_bundle: bytes
    url: str = ""
    service_namespace: str = ""
    service_name: str = ""
    service_port: int = 443

    def for_path(self, path: str) -> dict[str, Any]:
        config: dict[str, Any] = {"caBundle": base64.b64encode(self.ca_bundle).decode()}
        if self.service_name:
            config["service"] = {
                "namespace": self.service_namespace, "name": self.service_name, "port": self.service_port, "path": path,
            }
        else:
            config["url"] = self.url.rstrip("/") + path
        return config

    @property
    def hosts(self) -> list[str]:
        """The names the serving certificate must hold for this config."""
        if self.service_name:
            n, ns = self.service_name, self.service_namespace
            return [f"{n}.{ns}.svc", f"{n}.{ns}.svc.cluster.local", f"{n}.{ns}", n]
        from urllib.parse import urlsplit

        host = urlsplit(self.url).hostname or "localhost"
        return list(dict.fromkeys([host, "localhost", "127.0.0.1"]))


def parse_service(value: str) -> tuple[str, str, int]:
    """``"ns/name"`` or ``"ns/name:8443"`` → ``(ns, name, port)``; raises ConfigError otherwise."""
    ns, _, rest = value.partition("/")
    name, _, port = rest.partition(":")
    try:
        number = int(port) if port else 443
    except ValueError:
        number = -1
    if not ns or not name or "/" in name or not 1 <= number <= 65535:
        raise ConfigError(f"--webhook-service {value!r} is not NAMESPACE/NAME[:PORT], e.g. operators/widget-operator-webhook:443")
    return ns, name, number


def _versions(hook: Webhook) -> list[str]:
    """Every version, or a typed handler's model's only (the apiserver converts to it)."""
    kind_of = getattr(hook.model, "kind_of", None)
    return [kind_of().version] if kind_of is not None else ["*"]


def _entry(hook: Webhook, info: ResourceInfo, client: ClientConfig, own_namespace: str | None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": hook.name,
        "clientConfig": client.for_path(hook.path),
        "rules": [
            {
                "apiGroups": [info.group],
                "apiVersions": _versions(hook),
                "operations": list(hook.operations),
                # "widgets" is the main resource only; "widgets/status" that subresource only
                "resources": [f"{info.plural}/{s}" for s in hook.subresources] or [info.plural],
                "scope": "Namespaced" if info.namespaced else "Cluster",
            }
        ],
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "failurePolicy": hook.failure_policy,
        "timeoutSeconds": hook.timeout,
        "matchPolicy": "Equivalent",
    }
    excluded = [] if hook.system_namespaces else list(SYSTEM_NAMESPACES)
    if own_namespace and own_namespace not in excluded:
        excluded.append(own_namespace)
    if excluded:
        entry["namespaceSelector"] = {
            "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": excluded}]
        }
    if hook.labels:
        entry["objectSelector"] = _label_selector(hook.labels)
    if hook.kind == "mutator":
        entry["reinvocationPolicy"] = "Never"
    return entry


def _label_selector(canonical: str) -> dict[str, Any]:
    """A canonical label selector string as a ``LabelSelector`` object."""
    ops = {"in": "In", "notin": "NotIn", "exists": "Exists", "!exists": "DoesNotExist"}
    expressions = []
    for r in parse_selector(canonical).requirements:
        expression: dict[str, Any] = {"key": r.key, "operator": ops[r.op]}
        if r.op in ("in", "notin"):
            expression["values"] = sorted(r.values)
        expressions.append(expression)
    return {"matchExpressions": expressions}


def configuration(
    kind: str, name: str, hooks: list[tuple[Webhook, ResourceInfo]], client: ClientConfig, own_namespace: str | None
) -> dict[str, Any]:
    """The Validating- (``kind="validator"``) or MutatingWebhookConfiguration for ``hooks``."""
    return {
        "apiVersion": ADMISSION_API,
        "kind": _KINDS[kind],
        # no labels: the chart creates these objects with its own (so that `helm uninstall`
        # deletes them), and a label of ours would flip theirs on every apply and upgrade
        "metadata": {"name": name},
        "webhooks": [_entry(h, info, client, own_namespace) for h, info in hooks],
    }


def conversion_patch(hook: Webhook, client: ClientConfig) -> dict[str, Any]:
    """The merge patch that points a CRD's conversion at ``hook``."""
    return {
        "spec": {
            "conversion": {
                "strategy": "Webhook",
                "webhook": {"conversionReviewVersions": ["v1"], "clientConfig": client.for_path(hook.path)},
            }
        }
    }


def conversion_client_config(hook: Webhook, *, service: str | None, url: str | None, port: int) -> dict[str, Any]:
    """The ``clientConfig`` the operator sets for ``hook`` when it starts with the same
    ``--webhook-service``, ``--webhook-url`` and ``--webhook-port`` — without the ``caBundle``,
    which only the running operator knows (its CA). ``declop crd`` writes it into the CRD so
    that the CRD a user applies points where the operator will serve.

    Raises:
        ConfigError: a malformed ``service``, or a ``url`` that is not ``https://``.
    """
    if service:
        namespace, name, service_port = parse_service(service)
        client = ClientConfig(b"", service_namespace=namespace, service_name=name, service_port=service_port)
    else:
        url = url or f"https://127.0.0.1:{port}"
        if not url.startswith("https://"):
            raise ConfigError(f"--webhook-url {url!r} must start with https:// (the apiserver calls webhooks over TLS only)")
        client = ClientConfig(b"", url=url)
    config = client.for_path(hook.path)
    del config["caBundle"]
    return config


async def apply_configurations(
    request: Request, name: str, hooks: list[tuple[Webhook, ResourceInfo]], client: ClientConfig, own_namespace: str | None
) -> None:
    """Apply the configurations and CRD conversions for ``hooks``; ConfigError on a refusal."""
    for kind in ("validator", "mutator"):
        # applied even when empty: entries of handlers removed since the last start go away
        # (the list is a map keyed by name, so an apply drops what this manager no longer sends)
        mine = [(h, i) for h, i in hooks if h.kind == kind]
        body = configuration(kind, name, mine, client, own_namespace)
        path = f"/apis/{ADMISSION_API}/{_PLURALS[kind]}/{name}"
        try:
            await request(
                "PATCH", path, params={"fieldManager": FIELD_MANAGER, "force": "true"}, body=body,
                content_type="application/apply-patch+yaml",
            )
        except ApiError as exc:
            raise _apply_error(_KINDS[kind], _PLURALS[kind], name, exc) from None
        log.info(f"Registered {_KINDS[kind]}", extra={"kv": {"name": name, "webhooks": [h.name for h, _ in mine]}})
    for hook, info in hooks:
        if hook.kind != "converter":
            continue
        if not info.group:
            raise ConfigError(f"converter {hook.name!r}: {info.group_resource} is not a custom resource; only CRDs have conversion webhooks")
        crd = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{info.group_resource}"
        try:
            await request("PATCH", crd, body=conversion_patch(hook, client), content_type="application/merge-patch+json")
        except ApiError as exc:
            raise ConfigError(f"cannot set the conversion webhook of CRD {info.group_resource}: {exc}") from None
        log.info("Registered the conversion webhook", extra={"kv": {"crd": info.group_resource, "webhook": hook.name}})


def _apply_error(kind: str, plural: str, name: str, exc: ApiError) -> ConfigError:
    """One line for a refused apply. An apply to a missing object creates it, which the chart's
    RBAC does not allow (no ``create``): the apiserver answers 403 "cannot create"; a 404 means
    the same. Say that the chart makes the object, and how to get it back."""
    text = str(exc).replace("\n", " ")
    if exc.status == 404 or (exc.status == 403 and "cannot create" in text):
        return ConfigError(
            f"the {kind} {name!r} does not exist and this operator may not create it: the chart creates it "
            "(empty) at install; if it was deleted, `helm upgrade` the release to restore it "
            f"(without the chart: create it, or grant create on {plural}) ({exc.status} {exc.reason})"
        )
    if exc.status == 403:
        return ConfigError(f"cannot apply the {kind} {name!r}: {text}; the operator needs patch on {plural} named {name!r}")
    return ConfigError(f"cannot apply the {kind} {name!r}: {text}")
