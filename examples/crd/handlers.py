"""A Widget operator: each Widget owns a Deployment and a Service, and reports a Ready condition.

    declop crd examples/crd/handlers.py | kubectl apply -f -     # the CRD, from the Widget model below
    declop run examples/crd/handlers.py
    kubectl apply -f examples/crd/widget.yaml
    kubectl get widgets,deployments,services

* **Children.** The Deployment and the Service carry a controller ownerReference
  (``declop.set_controller_reference``): deleting the Widget deletes them (garbage collection),
  and ``owns=`` makes any change to them — a ``kubectl delete``, a ``kubectl scale``, the
  Deployment's status moving — wake the Widget's reconciler, which puts back what it owns.
* **No needless writes.** ``declop.create_or_update`` compares before writing: a reconcile that
  finds everything in place sends nothing (so the Deployment's status updates, which wake us,
  never cause a write loop). The mutate functions set only the fields this operator owns, and
  spell out the values the apiserver would default inside lists (``protocol: TCP``).
* **Status.** ``status.conditions`` (a list of ``declop.Condition``) holds a ``Ready`` condition
  with ``observedGeneration``, set with ``declop.conditions.set`` on the typed status: its
  ``lastTransitionTime`` changes only when its status does. Status is written only when it differs.
* **The CRD is the model.** ``Widget`` (a ``CustomResource``) declares the kind, its printer
  columns and the schema of ``spec`` and ``status`` — bounds, defaults, the conditions list keyed
  by ``type``; ``declop crd`` prints the CRD from it and ``declop dev`` applies it (docs/typed.md).
  There is no hand-written CRD to keep in step. The handler declares ``obj: Widget | None`` and
  gets a validated ``Widget`` (``obj.spec.replicas``); ``client.patch_status(request, status)``
  with the ``WidgetStatus`` model sends only what changed since the handler read it (docs/typed.md,
  "Status writes").
* **Predicates.** ``generation_changed`` drops the Widget's own status-only updates (our writes
  coming back); events on the children are not filtered.

The pure functions below (``desired_*``) are what ``examples/test_widget_unit.py``
tests without any cluster, through ``declop.testing.fakes.client.run_reconcile``.
"""

from typing import Annotated

from pydantic import BaseModel, Field

import declop
from declop.typed.model import Column, CustomResource, ListType


class WidgetSpec(BaseModel):
    """What a Widget runs: ``replicas`` Pods of ``image``, with ``message`` in their environment."""

    replicas: int = Field(1, ge=0, le=50, description="Pods to run (0-50).")
    image: str = Field("nginx:1.27", min_length=1, description="The container image.")
    message: str = Field("", max_length=1024, description="The value of the MESSAGE environment variable.")
    secretName: str | None = Field(None, description="A Secret whose checksum the status records (examples/watches.py).")


class WidgetStatus(BaseModel):
    """What the operator saw at its last reconcile."""

    observedGeneration: int | None = None
    readyReplicas: int = 0
    conditions: Annotated[list[declop.Condition], ListType("map", keys=("type",))] = Field(default_factory=list)
    secretChecksum: str | None = None


class Widget(
    CustomResource,
    group="example.com",
    version="v1",
    kind="Widget",
    short_names=("wg",),
    printer_columns=(
        Column("Ready", '.status.conditions[?(@.type=="Ready")].status'),
        Column("Replicas", ".status.readyReplicas", type="integer"),
        Column("Age", ".metadata.creationTimestamp", type="date"),
    ),
):
    """A Widget: a Deployment and a Service, and a Ready condition when its Pods are."""

    spec: WidgetSpec = Field(default_factory=WidgetSpec)
    status: WidgetStatus | None = None


MANAGED_BY = {"app.kubernetes.io/managed-by": "declop"}


def selector(widget: Widget):
    return {"example.com/widget": widget.metadata.name}


def skeleton(widget: Widget, api_version, kind):
    """Which object: the child's identity, named after its Widget."""
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": widget.metadata.name, "namespace": widget.metadata.namespace}}


def desired_deployment(widget: Widget):
    """A mutate function for the Deployment: sets only the fields this operator owns."""
    spec = widget.spec

    def mutate(deployment):
        declop.set_controller_reference(deployment, widget)
        deployment["metadata"].setdefault("labels", {}).update({**MANAGED_BY, **selector(widget)})
        ds = deployment.setdefault("spec", {})
        ds["replicas"] = spec.replicas
        ds["selector"] = {"matchLabels": selector(widget)}  # immutable: always the same value
        template = ds.setdefault("template", {})
        template.setdefault("metadata", {}).setdefault("labels", {}).update(selector(widget))
        containers = template.setdefault("spec", {}).setdefault("containers", [])
        web = next((c for c in containers if c.get("name") == "web"), None)
        if web is None:
            web = {"name": "web"}
            containers.append(web)
        web["image"] = spec.image
        web["env"] = [{"name": "MESSAGE", "value": spec.message}]
        web["ports"] = [{"name": "http", "containerPort": 80, "protocol": "TCP"}]

    return mutate


def desired_service(widget: Widget):
    """A mutate function for the Service (clusterIP and the other defaults stay the server's)."""

    def mutate(service):
        declop.set_controller_reference(service, widget)
        service["metadata"].setdefault("labels", {}).update({**MANAGED_BY, **selector(widget)})
        ss = service.setdefault("spec", {})
        ss["selector"] = selector(widget)
        ss["ports"] = [{"name": "http", "port": 80, "targetPort": 80, "protocol": "TCP"}]

    return mutate


def desired_status(widget: Widget, deployment) -> WidgetStatus:
    """The Widget's status given its Deployment as the cache shows it (None: not there yet)."""
    status = widget.status.model_copy(deep=True) if widget.status else WidgetStatus()
    generation = widget.metadata.generation
    want = widget.spec.replicas
    if deployment is None:
        ready, settled = 0, False
    else:
        ds = deployment.get("status") or {}
        ready = ds.get("readyReplicas", 0)
        settled = ds.get("observedGeneration") == deployment["metadata"].get("generation")
    available = settled and ready >= want
    status.observedGeneration = generation
    status.readyReplicas = ready
    # keeps lastTransitionTime when the status does not change, and assigns the list back
    declop.conditions.set(
        status,
        "Ready",
        available,
        reason="Available" if available else "Progressing",
        message=f"{ready}/{want} replicas ready",
        observed_generation=generation,
    )
    return status


@declop.reconciler(
    Widget,
    owns=["deployments.apps", "services"],
    predicates=[declop.predicates.generation_changed],
)
def widget(request, client, logger, obj: Widget | None, **_):
    if obj is None:
        logger.info("Widget deleted; the garbage collector removes its Deployment and Service")
        return None

    for api_version, kind, mutate in (
        ("apps/v1", "Deployment", desired_deployment(obj)),
        ("v1", "Service", desired_service(obj)),
    ):
        operation = declop.create_or_update(client, skeleton(obj, api_version, kind), mutate)
        if operation != "unchanged":
            logger.info(f"{kind} {operation}", name=obj.metadata.name)

    try:
        deployment = client.get("deployments.apps", obj.metadata.name)
    except declop.NotFound:
        deployment = None  # just created: the cache sees it a moment later, and that wakes us
    status = desired_status(obj, deployment)
    if status != obj.status:
        client.patch_status(request, status)  # only what differs from what was read, guarded
        ready = next(c for c in status.conditions if c.type == "Ready")
        logger.info("Status updated", ready=ready.status, reason=ready.reason)
    return None
