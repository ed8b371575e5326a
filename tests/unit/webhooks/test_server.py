"""declop.webhooks.server over plain HTTP (aiohttp's test server): every answer the module
docstring lists, bad input, and that nothing from the object or the exception leaves."""

from __future__ import annotations

import asyncio
import gc
import base64
import json
import logging
import time
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

import declop
from declop.webhooks.patch import apply
from declop.registry import Registry
from declop.webhooks.server import WebhookServer

OBJ = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w", "namespace": "ns"}, "spec": {"size": 3, "token": "s3cr3t"}}


def admission(uid: str = "u1", operation: str = "CREATE", obj: Any = OBJ, **extra: Any) -> dict[str, Any]:
    request = {"uid": uid, "operation": operation, "object": obj, "namespace": "ns", "name": "w", **extra}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def post(reg: Registry, path: str, body: Any) -> tuple[int, Any]:
    """POST ``body`` (a dict as JSON, or raw bytes) to a server for ``reg``; (status, JSON or text)."""

    async def go() -> tuple[int, Any]:
        server = WebhookServer(reg.webhooks, port=0, ssl_context=None)
        try:
            async with TestClient(TestServer(server.app())) as client:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                resp = await client.post(path, data=data)
                text = await resp.text()
                try:
                    return resp.status, json.loads(text)
                except json.JSONDecodeError:
                    return resp.status, text
        finally:
            await server.stop()

    return asyncio.run(go())


def test_validator_allows_denies_and_warns():
    reg = Registry()
    seen: list[dict[str, Any]] = []

    @declop.validator("widgets.example.com", registry=reg)
    def check(obj, old_obj, operation, dry_run, request_uid, user_info, subresource, warnings):
        seen.append(dict(operation=operation, dry_run=dry_run, uid=request_uid, user=user_info, old=old_obj, sub=subresource))
        if obj["spec"]["size"] > 5:
            raise declop.Rejected("must be at most 5", field="spec.size", code=422)
        warnings.append("size is odd")
        return "deprecated field"

    status, answer = post(reg, "/validate/check.widgets.example.com", admission(dryRun=True, userInfo={"username": "alice"}))
    assert status == 200
    assert answer["response"] == {"uid": "u1", "allowed": True, "warnings": ["size is odd", "deprecated field"]}
    assert seen == [dict(operation="CREATE", dry_run=True, uid="u1", user={"username": "alice"}, old=None, sub="")]

    big = {**OBJ, "spec": {"size": 9}}
    status, answer = post(reg, "/validate/check.widgets.example.com", admission(obj=big))
    assert answer["response"]["allowed"] is False
    assert answer["response"]["status"]["message"] == "spec.size: must be at most 5"
    assert answer["response"]["status"]["code"] == 422


def test_async_validator_and_list_of_warnings():
    reg = Registry()

    @declop.validator("widgets.example.com", registry=reg)
    async def check(obj):
        await asyncio.sleep(0)
        return ["a", "b"]

    _, answer = post(reg, "/validate/check.widgets.example.com", admission())
    assert answer["response"]["warnings"] == ["a", "b"]


def test_handler_error_is_denied_generically_and_logged(caplog):
    reg = Registry()

    @declop.validator("widgets.example.com", registry=reg)
    def check(obj):
        raise KeyError(obj["spec"]["token"])

    with caplog.at_level(logging.ERROR, logger="declop.webhook"):
        _, answer = post(reg, "/validate/check.widgets.example.com", admission())
    response = answer["response"]
    assert response["allowed"] is False and response["status"]["code"] == 500
    assert response["status"]["message"] == "webhook check.widgets.example.com failed on this request; the operator's log has the details"
    assert "s3cr3t" not in json.dumps(answer) and "KeyError" not in json.dumps(answer)
    (record,) = [r for r in caplog.records if r.msg == "Webhook handler raised; the request is denied"]
    assert record.exc_info and record.exc_info[0] is KeyError


def test_validator_returning_a_bool_is_denied(caplog):
    reg = Registry()
    declop.validator("widgets.example.com", registry=reg)(lambda obj: False)
    _, answer = post(reg, "/validate/lambda.widgets.example.com", admission())
    assert answer["response"]["allowed"] is False
    assert any("returned something other than None" in r.msg for r in caplog.records)


def test_handler_past_its_timeout_is_reported(caplog):
    reg = Registry()

    @declop.validator("widgets.example.com", timeout=1, registry=reg)
    async def slow(obj):
        await asyncio.sleep(5)

    started = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="declop.webhook"):
        _, answer = post(reg, "/validate/slow.widgets.example.com", admission())
    assert time.monotonic() - started < 3
    assert answer["response"]["status"]["message"] == "webhook slow.widgets.example.com did not answer within its timeout of 1 s"
    (record,) = [r for r in caplog.records if "took longer than its timeout" in r.msg]
    assert record.kv["webhook"] == "slow.widgets.example.com" and record.kv["timeoutSeconds"] == 1


def test_handler_past_its_timeout_with_ignore_is_admitted_with_a_warning(caplog):
    """A late answer that beats the apiserver's own timeout must still give the policy's outcome."""
    reg = Registry()

    @declop.validator("widgets.example.com", timeout=1, failure_policy="Ignore", registry=reg)
    async def slow(obj):
        await asyncio.sleep(5)

    with caplog.at_level(logging.ERROR, logger="declop.webhook"):
        _, answer = post(reg, "/validate/slow.widgets.example.com", admission())
    assert answer["response"]["allowed"] is True
    assert answer["response"]["warnings"] == [
        "webhook slow.widgets.example.com did not answer within its timeout of 1 s; admitted (failurePolicy Ignore)"
    ]
    (record,) = [r for r in caplog.records if "took longer than its timeout" in r.msg]
    assert record.kv["failurePolicy"] == "Ignore"


def test_mutator_patch_in_place_returned_and_none():
    reg = Registry()

    @declop.mutator("widgets.example.com", registry=reg)
    def defaults(obj):
        obj["spec"].setdefault("color", "blue")
        obj["metadata"].setdefault("labels", {})["example.com/sized"] = "yes"

    @declop.mutator("widgets.example.com", registry=reg)
    def replace(obj):
        return {**obj, "spec": {"size": 1}}

    @declop.mutator("widgets.example.com", registry=reg)
    def noop(obj):
        obj["spec"]["size"] = 3  # same value: no change

    _, answer = post(reg, "/mutate/defaults.widgets.example.com", admission())
    patch = json.loads(base64.b64decode(answer["response"]["patch"]))
    assert answer["response"]["patchType"] == "JSONPatch"
    assert apply(OBJ, patch) == {**OBJ, "metadata": {**OBJ["metadata"], "labels": {"example.com/sized": "yes"}}, "spec": {**OBJ["spec"], "color": "blue"}}

    _, answer = post(reg, "/mutate/replace.widgets.example.com", admission())
    assert apply(OBJ, json.loads(base64.b64decode(answer["response"]["patch"])))["spec"] == {"size": 1}

    _, answer = post(reg, "/mutate/noop.widgets.example.com", admission())
    assert answer["response"] == {"uid": "u1", "allowed": True}


def test_mutator_on_delete_sends_no_patch():
    reg = Registry()
    declop.mutator("widgets.example.com", operations=["DELETE"], registry=reg)(lambda obj, old_obj: None)
    _, answer = post(reg, "/mutate/lambda.widgets.example.com", admission(operation="DELETE", obj=None, oldObject=OBJ))
    assert answer["response"] == {"uid": "u1", "allowed": True}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"<html>", "bad request: the request body is not valid JSON"),
        ({"apiVersion": "v1", "kind": "Pod"}, "bad request: unknown kind 'Pod': this path answers AdmissionReview only"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"operation": "CREATE"}}, "bad request: the AdmissionReview request has no uid"),
    ],
)
def test_bad_input_is_a_400_logged_once_and_the_server_keeps_serving(body, message, caplog):
    reg = Registry()
    declop.validator("widgets.example.com", registry=reg)(lambda obj: None)

    async def go() -> list[tuple[int, str]]:
        server = WebhookServer(reg.webhooks, port=0, ssl_context=None)
        async with TestClient(TestServer(server.app())) as client:
            out = []
            for data in (body if isinstance(body, bytes) else json.dumps(body).encode(), json.dumps(admission()).encode()):
                resp = await client.post("/validate/lambda.widgets.example.com", data=data)
                out.append((resp.status, await resp.text()))
            return out

    with caplog.at_level(logging.WARNING, logger="declop.webhook"):
        (bad_status, bad_text), (good_status, good_text) = asyncio.run(go())
    assert bad_status == 400 and bad_text.startswith(message) and bad_text.count("\n") == 1
    assert good_status == 200 and json.loads(good_text)["response"]["allowed"] is True
    assert len([r for r in caplog.records if r.msg == "Bad webhook request"]) == 1
    assert not any(r.exc_info for r in caplog.records)


def conversion(objects: list[dict[str, Any]], desired: str = "example.com/v1") -> dict[str, Any]:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "request": {"uid": "c1", "desiredAPIVersion": desired, "objects": objects}}


def widget(version: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"example.com/{version}", "kind": "Widget", "metadata": {"name": name, "uid": name}, "spec": spec}


def test_converter_batch():
    reg = Registry()
    calls = []

    @declop.converter("widgets.example.com", registry=reg)
    def convert(obj, desired_api_version):
        calls.append(obj["metadata"]["name"])
        if desired_api_version == "example.com/v1":
            obj["spec"] = {"replicas": obj["spec"].pop("size")}
        else:
            obj["spec"] = {"size": obj["spec"].pop("replicas")}

    objects = [widget("v1alpha1", "a", {"size": 1}), widget("v1", "b", {"replicas": 2})]
    status, answer = post(reg, "/convert/convert.widgets.example.com", conversion(objects))
    assert status == 200
    assert answer["response"]["result"] == {"status": "Success"}
    assert answer["response"]["convertedObjects"] == [widget("v1", "a", {"replicas": 1}), widget("v1", "b", {"replicas": 2})]
    assert calls == ["a"]  # b is already at v1


def test_converter_failure_names_the_object_not_its_data(caplog):
    reg = Registry()

    @declop.converter("widgets.example.com", registry=reg)
    def convert(obj, desired_api_version):
        if obj["metadata"]["name"] == "bad":
            raise ValueError(obj["spec"]["token"])
        if obj["metadata"]["name"] == "refused":
            raise declop.Rejected("size must be set", field="spec.size")
        return obj

    _, answer = post(reg, "/convert/convert.widgets.example.com", conversion([widget("v1alpha1", "ok", {}), widget("v1alpha1", "bad", {"token": "s3cr3t"})]))
    result = answer["response"]["result"]
    assert result["status"] == "Failure"
    assert result["message"] == (
        "converting bad from example.com/v1alpha1 to example.com/v1 failed: webhook convert.widgets.example.com "
        "raised ValueError; the operator's log has the details"
    )
    assert "s3cr3t" not in json.dumps(answer)
    _, answer = post(reg, "/convert/convert.widgets.example.com", conversion([widget("v1alpha1", "refused", {})]))
    assert answer["response"]["result"]["message"] == "converting refused from example.com/v1alpha1 to example.com/v1: spec.size: size must be set"


def test_unknown_path_is_404():
    reg = Registry()
    declop.validator("widgets.example.com", registry=reg)(lambda obj: None)
    status, _ = post(reg, "/validate/other.widgets.example.com", admission())
    assert status == 404


def test_requests_are_counted_with_controller_runtime_names():
    from declop.serving.metrics import Metrics

    reg = Registry()
    declop.validator("widgets.example.com", registry=reg)(lambda obj: None)
    metrics = Metrics()

    async def go() -> None:
        server = WebhookServer(reg.webhooks, port=0, ssl_context=None)
        server.observer, server.in_flight = metrics.webhook, metrics.webhook_serving
        async with TestClient(TestServer(server.app())) as client:
            for data in (json.dumps(admission()).encode(), b"junk"):
                await (await client.post("/validate/lambda.widgets.example.com", data=data)).read()
            await (await client.post("/validate/nothing", data=b"{}")).read()

    asyncio.run(go())
    text = metrics.exposition().decode()
    path = "/validate/lambda.widgets.example.com"
    assert f'controller_runtime_webhook_requests_total{{code="200",webhook="{path}"}} 1.0' in text
    assert f'controller_runtime_webhook_requests_total{{code="400",webhook="{path}"}} 1.0' in text
    assert "/validate/nothing" not in text  # paths not served are not counted (no unbounded labels)
    assert f'controller_runtime_webhook_latency_seconds_count{{webhook="{path}"}} 2.0' in text
    assert f'controller_runtime_webhook_requests_in_flight{{webhook="{path}"}} 0.0' in text


# -- hostile and broken input (issue 23) ---------------------------------------------------------


def _deep(depth: int) -> str:
    """An object nested ``depth`` levels (the object itself is level 1), as JSON text."""
    inner = '{"leaf": true}'
    return '{"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w", "namespace": "ns"}, "spec": ' + '{"a": ' * (depth - 3) + inner + "}" * (depth - 3) + "}"


def _review_text(obj: str) -> bytes:
    return ('{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u1", "operation": "CREATE", "object": ' + obj + "}}").encode()


@pytest.mark.parametrize("depth", [10, 500, 1000, 10000])
def test_deep_objects_are_handled_or_denied_never_500(depth):
    reg = Registry()
    calls: list[str] = []

    @declop.validator("widgets.example.com", registry=reg)
    def check(obj):
        calls.append("validator")

    @declop.mutator("widgets.example.com", registry=reg)
    def label(obj):
        calls.append("mutator")
        obj["metadata"]["labels"] = {"seen": "yes"}

    for path in ("/validate/check.widgets.example.com", "/mutate/label.widgets.example.com"):
        status, answer = post(reg, path, _review_text(_deep(depth)))
        assert status == 200, (depth, path, answer)
        response = answer["response"]
        print(f"depth {depth} {path}: allowed={response['allowed']} {response.get('status', {}).get('message', '')}")
        if depth <= 512:
            assert response["allowed"] is True
            if path.startswith("/mutate"):
                assert json.loads(base64.b64decode(response["patch"])) == [{"op": "add", "path": "/metadata/labels", "value": {"seen": "yes"}}]
        else:
            assert response["allowed"] is False
            assert "nested deeper than 512 levels" in response["status"]["message"]
    assert calls == (["validator", "mutator"] if depth <= 512 else [])

    reg2 = Registry()

    @declop.converter("widgets.example.com", registry=reg2)
    def convert(obj, desired_api_version):
        return obj

    objects = '[{"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "shallow"}}, ' + _deep(depth).replace('"name": "w"', '"name": "deep"') + "]"
    body = ('{"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview", "request": {"uid": "c1", "desiredAPIVersion": "example.com/v2", "objects": ' + objects + "}}").encode()
    status, answer = post(reg2, "/convert/convert.widgets.example.com", body)
    assert status == 200
    result = answer["response"]["result"]
    if depth <= 512:
        assert result == {"status": "Success"} and len(answer["response"]["convertedObjects"]) == 2
    else:
        assert result["status"] == "Failure" and "ns/deep" in result["message"] and "nested deeper" in result["message"]


@pytest.mark.parametrize("body", [b"[" * 100_000, b"1" * 5000, _review_text('{"n": ' + "1" * 5000 + "}"), b'{"kind": "AdmissionReview"' + b"]" * 10])
def test_malformed_bodies_get_400(body):
    reg = Registry()

    @declop.validator("widgets.example.com", registry=reg)
    def check(obj):
        pass

    status, answer = post(reg, "/validate/check.widgets.example.com", body)
    print(f"{body[:12]!r}… ({len(body)} bytes): {status} {answer.strip()}")
    assert status == 400 and "not valid JSON" in answer


def test_a_failure_after_the_mutator_is_a_denial_not_500():
    reg = Registry()

    @declop.mutator("widgets.example.com", registry=reg)
    def deepen(obj):
        value: Any = 1
        for _ in range(5000):  # deeper than json.dumps can encode
            value = [value]
        obj["spec"]["deep"] = value

    status, answer = post(reg, "/mutate/deepen.widgets.example.com", admission())
    assert status == 200 and answer["response"]["allowed"] is False
    assert "could not process this request (RecursionError)" in answer["response"]["status"]["message"]


def _big_review(size: int) -> bytes:
    item = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "labels": {"a": "b"}}, "data": {f"k{j}": "v" * 20 for j in range(30)}}
    per = len(json.dumps(item)) + 2
    obj = {**OBJ, "spec": {"items": [item] * ((size - 400) // per - 8)}}
    return json.dumps(admission(obj=obj)).encode()


_CLIENT = """
import asyncio, sys, aiohttp
port, n, path, fname = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
body = open(fname, "rb").read()
async def main():
    async with aiohttp.ClientSession() as session:
        async def one():
            async with session.post(f"http://127.0.0.1:{port}{path}", data=body) as resp:
                return f"{resp.status}:{(await resp.json())['response']['allowed']}"
        print(" ".join(await asyncio.gather(*(one() for _ in range(n)))))
asyncio.run(main())
"""


def test_sixteen_maximum_size_requests_at_once_neither_stall_the_loop_nor_fill_memory(tmp_path):
    """16 reviews of the maximum size at once, sent by another process (as the apiserver is):
    every one answered, the server's loop never stalled for long, and its memory grows by about
    one request's trees, not sixteen (the budget takes them one at a time). Measured on a quiet
    2-core machine: longest stall 15-30 ms (4.4 s for 8 before the hardening), peak RSS +90 MiB
    (+560 MiB for 16 before the budget). The bounds leave room for a loaded CI machine."""
    import resource
    import subprocess
    import sys

    from declop import collector
    from declop.webhooks.server import ADMISSION_MAX_BYTES

    reg = Registry()

    @declop.validator("widgets.example.com", registry=reg)
    def check(obj):
        pass

    body_ = _big_review(ADMISSION_MAX_BYTES - 1024)
    assert ADMISSION_MAX_BYTES - 64 * 1024 < len(body_) <= ADMISSION_MAX_BYTES
    (tmp_path / "body.json").write_bytes(body_)
    (tmp_path / "client.py").write_text(_CLIENT)
    collector.pause()  # a running operator did this at its first sync: the start-up heap frozen
    collector.resume()
    gc.collect()

    async def go() -> tuple[float, float, list[str]]:
        server = WebhookServer(reg.webhooks, port=0, ssl_context=None, host="127.0.0.1")
        await server.start()
        longest = 0.0
        done = asyncio.Event()

        async def tick() -> None:
            nonlocal longest
            last = time.perf_counter()
            while not done.is_set():
                await asyncio.sleep(0.005)
                now = time.perf_counter()
                longest = max(longest, now - last - 0.005)
                last = now

        ticker = asyncio.create_task(tick())
        started = time.perf_counter()
        try:
            client = await asyncio.create_subprocess_exec(
                sys.executable, str(tmp_path / "client.py"), str(server.port), "16",
                "/validate/check.widgets.example.com", str(tmp_path / "body.json"), stdout=subprocess.PIPE,
            )
            out, _ = await client.communicate()
        finally:
            done.set()
            await ticker
            await server.stop()
        return longest, time.perf_counter() - started, out.decode().split()

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    longest, took, answers = asyncio.run(go())
    grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before
    print(f"16 x {len(body_)} bytes: {set(answers)} in {took:.2f} s; longest loop stall {longest * 1000:.1f} ms; peak RSS +{grew:.0f} MiB")
    assert answers == ["200:True"] * 16
    assert longest < 0.15
    assert grew < 160


def _dense(unit: bytes, size: int, head: bytes | None = None) -> bytes:
    head = head if head is not None else (
        b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"u-dense","operation":"CREATE",'
        b'"object":{"kind":"Widget","apiVersion":"example.com/v1","metadata":{"name":"w"},"spec":{"x":['
    )
    tail = b"0]}}}}"
    return head + unit * ((size - len(head) - len(tail)) // len(unit)) + tail


@pytest.mark.parametrize("unit", [b"[],", b'{"":{}},', b"[[[]]],"])
def test_a_body_of_millions_of_tiny_containers_is_denied_before_it_is_decoded(unit):
    """7 MiB of ``[],`` is 2.4 million lists: 490 MiB of Python and 25 s of parsing before this
    check. It is denied (fail closed, 413) in milliseconds, naming the limit; the validator
    never runs."""
    from declop.webhooks.decode import MAX_CONTAINERS
    from declop.webhooks.server import ADMISSION_MAX_BYTES

    reg = Registry()
    called = []

    @declop.validator("widgets.example.com", registry=reg)
    def check(obj):
        called.append(1)

    started = time.monotonic()
    status, answer = post(reg, "/validate/check.widgets.example.com", _dense(unit, ADMISSION_MAX_BYTES - 4096))
    took = time.monotonic() - started
    print(f"{unit!r} x many: {status} in {took * 1000:.0f} ms: {answer['response']['status']['message']}")
    assert status == 200 and answer["response"]["uid"] == "u-dense" and answer["response"]["allowed"] is False
    assert answer["response"]["status"]["code"] == 413
    assert f"more than the {MAX_CONTAINERS}" in answer["response"]["status"]["message"]
    assert called == [] and took < 2


def test_a_dense_body_with_no_readable_uid_gets_400():
    reg = Registry()

    @declop.validator("widgets.example.com", registry=reg)
    def check(obj):
        pass

    status, answer = post(reg, "/validate/check.widgets.example.com", _dense(b"[],", 2 * 1024 * 1024, head=b'{"x":['))
    assert status == 400 and "JSON objects and arrays" in answer


def test_a_dense_conversion_review_fails_by_its_uid():
    reg = Registry()

    @declop.converter("widgets.example.com", registry=reg)
    def convert(obj, desired_api_version):
        return obj

    head = (
        b'{"kind":"ConversionReview","apiVersion":"apiextensions.k8s.io/v1","request":{"uid":"c-dense",'
        b'"desiredAPIVersion":"example.com/v2","objects":[{"apiVersion":"example.com/v1","kind":"Widget","x":['
    )
    status, answer = post(reg, "/convert/convert.widgets.example.com", _dense(b"[],", 2 * 1024 * 1024, head=head)[:-2] + b"}]}}")
    assert status == 200 and answer["response"]["uid"] == "c-dense"
    assert answer["response"]["result"]["status"] == "Failure" and "objects and arrays" in answer["response"]["result"]["message"]


def test_a_large_request_s_objects_a_handler_kept_are_left_whole():
    """The trees of a large request are taken apart after the answer — except what a handler
    still holds: a validator that keeps ``obj`` finds it intact."""
    reg = Registry()
    kept: list[Any] = []

    @declop.validator("widgets.example.com", registry=reg)
    def keep(obj, old_obj):
        kept.append(obj["spec"])
        kept.append(old_obj)

    body_ = json.dumps(admission(obj=json.loads(_big_review(300_000))["request"]["object"], operation="UPDATE",
                                 oldObject=json.loads(_big_review(200_000))["request"]["object"])).encode()
    expected_spec, expected_old = json.loads(body_)["request"]["object"]["spec"], json.loads(body_)["request"]["oldObject"]

    async def go() -> None:
        server = WebhookServer(reg.webhooks, port=0, ssl_context=None, host="127.0.0.1")
        await server.start()
        try:
            import aiohttp

            async with aiohttp.ClientSession() as session:
                async with session.post(f"http://127.0.0.1:{server.port}/validate/keep.widgets.example.com", data=body_) as resp:
                    assert (await resp.json())["response"]["allowed"] is True
        finally:
            await server.stop()

    asyncio.run(go())
    assert kept == [expected_spec, expected_old]


# --------------------------------------------------------------------------- typed validators (issue 26)

from pydantic import BaseModel, Field  # noqa: E402 - the typed section's own imports

from declop.typed.model import CustomResource  # noqa: E402


class WidgetSpec(BaseModel):
    size: int = Field(1, ge=0, le=5)
    token: str = ""


class TypedWidget(CustomResource, group="example.com", version="v1", kind="Widget"):
    spec: WidgetSpec


def test_a_typed_validator_gets_the_model_and_an_invalid_object_is_denied_by_field():
    reg = Registry()
    seen: list[Any] = []

    @declop.validator(TypedWidget, registry=reg)
    def check(obj: TypedWidget, **_: Any) -> None:
        seen.append(obj)

    assert reg.webhooks[0].resource == "widgets.v1.example.com"
    path = f"/validate/{reg.webhooks[0].name}"
    status, answer = post(reg, path, admission())
    assert answer["response"]["allowed"] is True and isinstance(seen[0], TypedWidget) and seen[0].spec.size == 3

    status, answer = post(reg, path, admission(obj={**OBJ, "spec": {"size": 9, "token": "s3cr3t"}}))
    assert answer["response"]["allowed"] is False and len(seen) == 1
    assert answer["response"]["status"]["code"] == 422
    assert answer["response"]["status"]["message"] == "spec.size: Input should be less than or equal to 5"


def test_a_mutator_with_an_untyped_obj_still_gets_the_dict():
    """Typed mutators and converters: tests/unit/webhooks/test_typed.py."""
    reg = Registry()
    seen: list[Any] = []
    declop.mutator(TypedWidget, registry=reg)(lambda obj: seen.append(obj))
    assert reg.webhooks[0].model is None
    post(reg, f"/mutate/{reg.webhooks[0].name}", admission())
    assert seen == [OBJ]
