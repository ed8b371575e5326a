"""Unit tests of the example reconcilers, with declop's test kit: no apiserver, no cluster, ~1 ms each.

    pytest examples/test_widget_unit.py

``run_reconcile`` calls a handler the way a controller worker does (same phase, same keyword
arguments, same outcome table) against a fake apiserver seeded with objects, and returns what it
did: ``writes``, ``logs``, ``error``, ``action`` and a ``client`` to look at the result. In your
own project, import your handlers module instead of loading files by path.
"""

from pathlib import Path

import declop
from declop.loader import load
from declop.testing.fakes.client import FakeClient, run_reconcile
from declop.typed.crd import definitions

HERE = Path(__file__).parent
operator, secrets = load([str(HERE / "crd" / "handlers.py"), str(HERE / "watches.py")])
(CRD,) = definitions([operator.Widget])  # the CRD `declop crd` prints: tells the fake about Widgets


def a_widget(name="hello", **spec):
    spec = {"message": "Hello", "replicas": 1, **spec}
    return {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name, "namespace": "default"}, "spec": spec}


def ready_condition(client, name="hello"):
    status = client.get("widgets.example.com", f"default/{name}").get("status") or {}
    return declop.conditions.get(status.get("conditions"), "Ready")


# -- the Widget operator (examples/crd/handlers.py) ------------------------------------------


def test_a_new_widget_gets_a_deployment_a_service_and_a_status():
    out = run_reconcile(operator.widget, "default/hello", [CRD, a_widget()])

    assert out.error is None and out.action == "done"
    assert [(w.verb, w.resource) for w in out.writes] == [
        ("create", "deployments.apps"),
        ("create", "services"),
        ("patch_status", "widgets.example.com"),
    ]
    assert out.messages == ("Deployment created", "Service created", "Status updated")

    deployment = out.client.get("deployments.apps", "default/hello")
    assert declop.reconcile.ownership.controller_of(deployment)["name"] == "hello"
    assert deployment["spec"]["template"]["spec"]["containers"][0]["env"] == [{"name": "MESSAGE", "value": "Hello"}]
    ready = ready_condition(out.client)
    assert (ready["status"], ready["reason"], ready["observedGeneration"]) == ("False", "Progressing", 1)


def test_a_second_reconcile_sends_nothing():
    first = run_reconcile(operator.widget, "default/hello", [CRD, a_widget()])
    again = run_reconcile(operator.widget, "default/hello", client=first.client)
    assert again.writes == ()  # create_or_update compared, found nothing to do


def test_a_child_deleted_or_edited_by_hand_is_put_back():
    out = run_reconcile(operator.widget, "default/hello", [CRD, a_widget()])
    client = out.client
    client.delete("services", "default/hello")
    client.patch("deployments.apps", "default/hello", {"spec": {"replicas": 5}})

    repair = run_reconcile(operator.widget, "default/hello", client=client)

    assert [(w.verb, w.resource) for w in repair.writes] == [("update", "deployments.apps"), ("create", "services")]
    assert client.get("deployments.apps", "default/hello")["spec"]["replicas"] == 1


def test_ready_follows_the_deployment_and_its_transition_time_moves_only_on_change():
    out = run_reconcile(operator.widget, "default/hello", [CRD, a_widget()])
    client = out.client
    # the fake runs no controller-manager: play its part and report one ready replica
    deployment = client.get("deployments.apps", "default/hello")
    client.patch_status(
        "deployments.apps",
        "default/hello",
        {"status": {"readyReplicas": 1, "observedGeneration": deployment["metadata"]["generation"]}},
    )
    run_reconcile(operator.widget, "default/hello", client=client)
    ready = ready_condition(client)
    assert (ready["status"], ready["reason"]) == ("True", "Available")

    # pretend it turned True long ago: a spec change the Deployment does not depend on keeps it
    # True (observedGeneration follows) and must not move the time…
    conditions = [{**ready, "lastTransitionTime": "2020-01-01T00:00:00Z"}]
    client.patch_status("widgets.example.com", "default/hello", {"status": {"conditions": conditions}})
    client.patch("widgets.example.com", "default/hello", {"spec": {"secretName": "unrelated"}})
    assert run_reconcile(operator.widget, "default/hello", client=client).writes_of("update") == []
    ready = ready_condition(client)
    assert (ready["status"], ready["observedGeneration"]) == ("True", 2)
    assert ready["lastTransitionTime"] == "2020-01-01T00:00:00Z"

    # …while asking for more replicas rolls the Deployment out: not Ready, and the time moves
    client.patch("widgets.example.com", "default/hello", {"spec": {"replicas": 2}})
    run_reconcile(operator.widget, "default/hello", client=client)
    ready = ready_condition(client)
    assert (ready["status"], ready["reason"], ready["message"]) == ("False", "Progressing", "1/2 replicas ready")
    assert ready["lastTransitionTime"] != "2020-01-01T00:00:00Z"


def test_a_deleted_widget_only_logs():
    out = run_reconcile(operator.widget, "default/gone", [CRD])
    assert out.phase is declop.Phase.DELETED and out.writes == ()
    assert out.messages == ("Widget deleted; the garbage collector removes its Deployment and Service",)


# -- the Secret watcher (examples/watches.py) ------------------------------------------------


def a_secret(name="db", password="czNjcmV0"):
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": "default"}, "data": {"password": password}}


def test_the_map_function_finds_exactly_the_widgets_that_name_the_secret():
    client = FakeClient(
        [CRD, a_widget("a", secretName="db"), a_widget("b", secretName="db"), a_widget("c", secretName="other"), a_widget("d")],
        registry=declop.registry.default_registry,  # where the example declared its index
    )
    found = secrets.widgets_for_secret(a_secret("db"), client=client)
    assert sorted(w["metadata"]["name"] for w in found) == ["a", "b"]


def test_the_checksum_is_recorded_once_and_follows_the_secret():
    out = run_reconcile(secrets.secret_checksum, "default/a", [CRD, a_secret(), a_widget("a", secretName="db")])
    assert [w.verb for w in out.writes] == ["patch_status"]  # an async handler, run with asyncio
    first = out.client.get("widgets.example.com", "default/a")["status"]["secretChecksum"]

    assert run_reconcile(secrets.secret_checksum, "default/a", client=out.client).writes == ()

    out.client.patch("secrets", "default/db", {"data": {"password": "Y2hhbmdlZA=="}})
    changed = run_reconcile(secrets.secret_checksum, "default/a", client=out.client)
    assert changed.messages == ("Secret checksum recorded",)
    assert out.client.get("widgets.example.com", "default/a")["status"]["secretChecksum"] != first


def test_a_missing_secret_is_waited_for():
    out = run_reconcile(secrets.secret_checksum, "default/a", [CRD, a_widget("a", secretName="db")])
    assert out.messages[0] == "Waiting for the Secret"
