"""declop.webhooks.admission and declop.webhooks.conversion: reading reviews, writing answers, bad input."""

from __future__ import annotations

import base64
import json

import pytest

from declop.webhooks.admission import BadReview, allow, deny, parse_admission
from declop.webhooks.conversion import converted, failed, finish, parse_conversion


def review(**request):
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}).encode()


def test_parse_admission_request():
    obj = {"metadata": {"name": "w"}}
    r = parse_admission(review(uid="u1", operation="UPDATE", object=obj, oldObject=obj, dryRun=True,
                               userInfo={"username": "alice"}, subResource="status", namespace="ns", name="w"))
    assert (r.uid, r.operation, r.dry_run, r.subresource, r.namespace, r.name) == ("u1", "UPDATE", True, "status", "ns", "w")
    assert r.obj == obj and r.old_obj == obj and r.user_info == {"username": "alice"}
    create = parse_admission(review(uid="u2", operation="CREATE", object=obj))
    assert create.old_obj is None and create.dry_run is False


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", r"^the request body is not valid JSON \(JSONDecodeError at position 1\); send a AdmissionReview$"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[1]", "is a JSON list, not a AdmissionReview object"),
        (json.dumps({"kind": "Pod", "apiVersion": "v1"}).encode(), r"unknown kind 'Pod': this path answers AdmissionReview only"),
        (json.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {"uid": "x"}}).encode(), "declop answers admission.k8s.io/v1 only"),
        (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(), "has no request object"),
        (review(operation="CREATE"), "request has no uid"),
        (review(uid="", operation="CREATE"), "request has no uid"),
        (review(uid="u"), "has no operation"),
        (review(uid="u", operation="CREATE", object=[1]), "object is not a JSON object"),
    ],
)
def test_bad_reviews(body, message):
    with pytest.raises(BadReview, match=message):
        parse_admission(body)


def test_bad_review_never_echoes_values():
    secret = "x" * 100
    with pytest.raises(BadReview) as info:
        parse_admission(json.dumps({"kind": secret}).encode())
    assert secret not in str(info.value)


def test_allow_with_patch_and_warnings():
    answer = allow("u1", patch=[{"op": "add", "path": "/a", "value": 1}], warnings=["careful"])
    response = answer["response"]
    assert answer["kind"] == "AdmissionReview" and answer["apiVersion"] == "admission.k8s.io/v1"
    assert response["uid"] == "u1" and response["allowed"] is True and response["warnings"] == ["careful"]
    assert response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"])) == [{"op": "add", "path": "/a", "value": 1}]
    assert "patch" not in allow("u1", patch=[])["response"]


def test_deny():
    response = deny("u1", "spec.size: too big", code=422)["response"]
    assert response == {
        "uid": "u1", "allowed": False,
        "status": {"status": "Failure", "message": "spec.size: too big", "code": 422, "reason": "Invalid"},
    }


def conversion(**request):
    return json.dumps({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview", "request": request}).encode()


def test_parse_conversion():
    r = parse_conversion(conversion(uid="c1", desiredAPIVersion="example.com/v1", objects=[{"a": 1}]))
    assert (r.uid, r.desired_api_version, r.objects) == ("c1", "example.com/v1", [{"a": 1}])
    with pytest.raises(BadReview, match="unknown kind 'AdmissionReview': this path answers ConversionReview only"):
        parse_conversion(review(uid="u", operation="CREATE"))
    with pytest.raises(BadReview, match="no desiredAPIVersion"):
        parse_conversion(conversion(uid="c1", objects=[]))
    with pytest.raises(BadReview, match="not a list of objects"):
        parse_conversion(conversion(uid="c1", desiredAPIVersion="example.com/v1", objects=[1]))
    with pytest.raises(BadReview, match="no uid"):
        parse_conversion(conversion(desiredAPIVersion="example.com/v1", objects=[]))


def test_finish_keeps_metadata_but_labels_and_annotations():
    original = {
        "apiVersion": "example.com/v1alpha1", "kind": "Widget",
        "metadata": {"name": "w", "namespace": "ns", "uid": "1", "resourceVersion": "5", "labels": {"a": "1"}, "annotations": {"k": "v"}},
        "spec": {"size": 1},
    }
    result = {
        "apiVersion": "whatever", "kind": "Other",
        "metadata": {"name": "renamed", "uid": "2", "labels": {"a": "2"}},
        "spec": {"replicas": 1},
    }
    out = finish(original, result, "example.com/v1")
    assert out == {
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w", "namespace": "ns", "uid": "1", "resourceVersion": "5", "labels": {"a": "2"}, "annotations": {"k": "v"}},
        "spec": {"replicas": 1},
    }
    assert "labels" not in finish(original, {"metadata": {"labels": {}}}, "example.com/v1")["metadata"]


def test_conversion_answers():
    ok = converted("c1", [{"a": 1}])
    assert ok["kind"] == "ConversionReview" and ok["response"] == {"uid": "c1", "result": {"status": "Success"}, "convertedObjects": [{"a": 1}]}
    bad = failed("c1", "no")["response"]
    assert bad["result"] == {"status": "Failure", "message": "no"}
