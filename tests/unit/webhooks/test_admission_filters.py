"""subresource=, field=, value= and when= on validators and mutators: the rule each
configuration entry gets, what a subresource's handler is given, and that a request the filters
exclude is allowed as sent without calling the handler (docs/webhooks.md, "Subresources" and
"Filters")."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest
from pydantic import Field
from aiohttp.test_utils import TestClient, TestServer

import declop
from declop.errors import RegistrationError
from declop.kube.discovery import ResourceInfo
from declop.registry import Registry
from declop.typed.model import CustomResource
from declop.webhooks.configuration import ClientConfig, configuration
from declop.webhooks.server import WebhookServer

WIDGETS = ResourceInfo("example.com", "v1", "widgets", "Widget", True)
CLIENT = ClientConfig(b"CA", url="https://127.0.0.1:9443")
OBJ = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w", "namespace": "ns"}, "spec": {"size": 3}}
SCALE = {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": "w", "namespace": "ns"}, "spec": {"replicas": 5}, "status": {"replicas": 3}}


class Gadget(CustomResource, group="example.com", version="v1", kind="Gadget"):
    pass


class Strict(CustomResource, group="example.com", version="v1", kind="Widget"):
    spec: dict[str, int] = Field(default_factory=dict)


def review(operation: str = "CREATE", obj: Any = OBJ, old: Any = None, **extra: Any) -> dict[str, Any]:
    request = {"uid": "u1", "operation": operation, "object": obj, "oldObject": old, "namespace": "ns", "name": "w", **extra}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def post(reg: Registry, path: str, *bodies: dict[str, Any]) -> list[dict[str, Any]]:
    """Each review's ``response`` from one server for ``reg``."""

    async def go() -> list[dict[str, Any]]:
        server = WebhookServer(reg.webhooks, port=0, ssl_context=None)
        try:
            async with TestClient(TestServer(server.app())) as client:
                out = []
                for body in bodies:
                    resp = await client.post(path, data=json.dumps(body).encode())
                    assert resp.status == 200
                    out.append((await resp.json())["response"])
                return out
        finally:
            await server.stop()

    return asyncio.run(go())


def rules(kind: str, reg: Registry) -> list[list[str]]:
    config = configuration(kind, "op", [(h, WIDGETS) for h in reg.webhooks if h.kind == kind], CLIENT, None)
    return [e["rules"][0]["resources"] for e in config["webhooks"]]


# -- subresource= ---------------------------------------------------------------------------


def test_without_subresource_the_rule_matches_the_main_resource_only():
    """``widgets`` in a rule is the main resource and none of its subresources (Kubernetes'
    RuleWithOperations): a status write is not sent to a plain validator."""
    reg = Registry()
    declop.validator("widgets.example.com", registry=reg)(lambda obj: None)
    assert rules("validator", reg) == [["widgets"]]
    assert reg.webhooks[0].subresources == ()


@pytest.mark.parametrize(
    ("given", "resources"),
    [("status", ["widgets/status"]), ("scale", ["widgets/scale"]), (["status", "scale"], ["widgets/status", "widgets/scale"]), ("*", ["widgets/*"])],
)
def test_subresource_makes_the_rule_match_that_subresource_instead(given, resources):
    reg = Registry()
    declop.validator("widgets.example.com", subresource=given, registry=reg)(lambda obj: None)
    declop.mutator("widgets.example.com", subresource=given, registry=reg)(lambda obj: None)
    assert rules("validator", reg) == [resources]
    assert rules("mutator", reg) == [resources]


@pytest.mark.parametrize("given", ["", "Status", "status/x", ["status", 3], [], ["*", "status"], 7])
def test_a_malformed_subresource_is_one_line(given):
    with pytest.raises(RegistrationError, match=r"subresource=.*'status' or 'scale'") as info:
        declop.validator("widgets.example.com", subresource=given, registry=Registry())(lambda obj: None)
    assert "\n" not in str(info.value)


def test_a_typed_handler_of_scale_is_refused_a_typed_status_one_is_not():
    """A scale request's object is an autoscaling/v1 Scale, which the resource's model cannot read."""
    def check(obj: Gadget) -> None: ...

    reg = Registry()
    declop.validator(Gadget, subresource="status", registry=reg)(check)
    assert reg.webhooks[0].model is Gadget
    with pytest.raises(RegistrationError, match="autoscaling/v1 Scale"):
        declop.validator(Gadget, subresource=["status", "scale"], name="scaled.gadgets.example.com", registry=reg)(check)


def test_a_status_handler_gets_the_whole_object_and_the_subresource():
    reg = Registry()
    seen: list[Any] = []

    @declop.validator("widgets.example.com", subresource="status", operations=["UPDATE"], registry=reg)
    def frozen(obj, old_obj, subresource):
        seen.append((subresource, obj["kind"], old_obj["status"]))
        if obj["status"] != old_obj["status"]:
            raise declop.Rejected("status is frozen")

    old = {**OBJ, "status": {"phase": "A"}}
    new = {**OBJ, "status": {"phase": "B"}}
    same, changed = post(reg, "/validate/frozen.widgets.example.com",
                         review("UPDATE", old, old, subResource="status"), review("UPDATE", new, old, subResource="status"))
    assert same == {"uid": "u1", "allowed": True}
    assert changed["allowed"] is False and changed["status"]["message"] == "status is frozen"
    assert seen == [("status", "Widget", {"phase": "A"}), ("status", "Widget", {"phase": "A"})]


def test_a_scale_mutator_gets_the_scale_and_patches_it():
    reg = Registry()

    @declop.mutator("widgets.example.com", subresource="scale", operations=["UPDATE"], registry=reg)
    def cap(obj, subresource):
        assert subresource == "scale" and obj["kind"] == "Scale"
        obj["spec"]["replicas"] = min(obj["spec"]["replicas"], 4)

    (answer,) = post(reg, "/mutate/cap.widgets.example.com", review("UPDATE", SCALE, SCALE, subResource="scale"))
    assert json.loads(base64.b64decode(answer["patch"])) == [{"op": "replace", "path": "/spec/replicas", "value": 4}]


# -- field=, value=, when= ------------------------------------------------------------------


def calls_of(reg_options: dict[str, Any], *bodies: dict[str, Any], kind: str = "validator") -> tuple[list[str], list[dict[str, Any]]]:
    """The operations the handler was called for, and each answer."""
    reg, called = Registry(), []

    def handler(obj, old_obj, operation):
        called.append(operation)
        if kind == "mutator":
            obj["spec"]["seen"] = True
        else:
            raise declop.Rejected("called")

    getattr(declop, kind)("widgets.example.com", registry=reg, operations=["CREATE", "UPDATE", "DELETE"], **reg_options)(handler)
    prefix = "validate" if kind == "validator" else "mutate"
    return called, post(reg, f"/{prefix}/handler.widgets.example.com", *bodies)


def widget(**spec: Any) -> dict[str, Any]:
    return {**OBJ, "spec": spec}


def test_field_calls_the_handler_only_when_the_field_is_present():
    called, answers = calls_of(
        {"field": "spec.replicas"},
        review(obj=widget(size=1)), review(obj=widget(replicas=2)), review(obj=widget(replicas=None)), review(obj={"kind": "Widget"}),
    )
    assert called == ["CREATE"]
    assert [a["allowed"] for a in answers] == [True, False, True, True]
    assert answers[0] == {"uid": "u1", "allowed": True}  # skipped: as sent, nothing added


def test_field_reads_the_new_object_on_update_and_the_old_one_on_delete():
    with_field, without = widget(replicas=2), widget(size=1)
    called, _ = calls_of(
        {"field": "spec.replicas"},
        review("UPDATE", without, with_field),  # removed by this update: the new object lacks it
        review("UPDATE", with_field, without),  # added by this update
        review("DELETE", None, with_field),
        review("DELETE", None, without),
    )
    assert called == ["UPDATE", "DELETE"]


def test_value_compares_the_field_or_calls_a_function_of_it():
    bodies = [review(obj=widget(replicas=n)) for n in (1, 3, 5)]
    assert calls_of({"field": "spec.replicas", "value": 3}, *bodies)[0] == ["CREATE"]
    called, _ = calls_of({"field": ["spec", "replicas"], "value": lambda n: n > 2}, *bodies)
    assert called == ["CREATE", "CREATE"]
    assert calls_of({"field": "spec.replicas", "value": 3}, review(obj=widget(size=3)))[0] == []


def test_when_decides_per_request_with_the_arguments_it_declares():
    seen = []

    def only_updates(operation, old_obj):
        seen.append(old_obj is not None)
        return operation == "UPDATE"

    called, answers = calls_of({"when": only_updates}, review(), review("UPDATE", OBJ, OBJ))
    assert called == ["UPDATE"] and seen == [False, True]
    assert answers[0]["allowed"] is True and answers[1]["allowed"] is False
    called, _ = calls_of({"field": "spec.size", "when": lambda **kw: kw["operation"] == "CREATE"}, review(), review(obj=widget(x=1)))
    assert called == ["CREATE"]  # both filters must agree


def test_an_excluded_request_to_a_mutator_gets_no_patch():
    called, answers = calls_of({"field": "spec.replicas"}, review(obj=widget(size=1)), review(obj=widget(replicas=1)), kind="mutator")
    assert called == ["CREATE"]
    assert answers[0] == {"uid": "u1", "allowed": True}
    assert json.loads(base64.b64decode(answers[1]["patch"])) == [{"op": "add", "path": "/spec/seen", "value": True}]


def test_an_excluded_request_skips_the_typed_model_too():
    """Excluded means the handler is not involved at all: its model does not check the object."""
    def check(obj: Strict) -> None: ...

    reg = Registry()
    declop.validator(Strict, field="spec.replicas", registry=reg)(check)
    hook = reg.webhooks[0].name
    skipped, checked = post(reg, f"/validate/{hook}", review(obj=widget(size="x")), review(obj=widget(replicas="x")))
    assert skipped["allowed"] is True
    assert checked["allowed"] is False and checked["status"]["code"] == 422


def test_a_filter_that_raises_denies_like_a_handler_that_raises(caplog):
    def broken(obj):
        raise KeyError("spec")

    _, (answer,) = calls_of({"when": broken}, review())
    assert answer["allowed"] is False and answer["status"]["code"] == 500
    assert "failed on this request" in answer["status"]["message"]
    assert "Webhook filter (value= or when=) raised" in caplog.text


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"value": 3}, "value= needs field="),
        ({"field": ""}, "field='': use a dotted path"),
        ({"field": "spec..size"}, "use a dotted path"),
        ({"field": 3}, "use a dotted path"),
        ({"when": "yes"}, "when= must be a plain function"),
        ({"when": lambda objj: True}, "when= 'lambda.widgets.example.com' takes an unknown argument 'objj': did you mean 'obj'"),
    ],
)
def test_bad_filters_are_one_line(options, message):
    with pytest.raises(RegistrationError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        declop.validator("widgets.example.com", registry=Registry(), **options)(lambda obj: None)
    assert "\n" not in str(info.value)


def test_an_async_when_is_refused():
    async def later(obj):
        return True

    with pytest.raises(RegistrationError, match="when= must be a plain function"):
        declop.mutator("widgets.example.com", when=later, registry=Registry())(lambda obj: None)


def test_converters_take_none_of_these_options():
    with pytest.raises(RegistrationError, match="unknown option subresource="):
        declop.converter("widgets.example.com", subresource="status", registry=Registry())(lambda obj: None)


def test_the_decorators_return_the_function_unchanged():
    def fn(obj):
        return None

    assert declop.validator("widgets.example.com", subresource="status", field="spec.x", value=1, when=lambda: True, registry=Registry())(fn) is fn
