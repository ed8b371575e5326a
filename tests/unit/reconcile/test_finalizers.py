"""declop.reconcile.finalizers: pure helpers, and guarded JSON patches through a fake transport."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest

from declop.kube.discovery import ResourceInfo
from declop.errors import ApiError, Conflict, Forbidden, NotFound
from declop.reconcile.finalizers import (
    JSON_PATCH,
    add_finalizer,
    contains_finalizer,
    ensure_finalizer,
    release_finalizer,
    remove_finalizer,
)
from declop.kube.transport import error_from

CONFIGMAPS = ResourceInfo(
    group="", version="v1", plural="configmaps", kind="ConfigMap", namespaced=True
)
WIDGETS = ResourceInfo(
    group="example.com", version="v1", plural="widgets", kind="Widget", namespaced=False
)
OURS = "example.com/cleanup"
THEIRS = "other.io/protect"
PATH = "/api/v1/namespaces/default/configmaps/cm"


class FakeTransport:
    """Records requests; answers with ``response`` or raises ``error``."""

    def __init__(self, response: Any = None, error: BaseException | None = None) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.response = response
        self.error = error

    async def request(self, method: str, path: str, **kw: Any) -> Any:
        self.calls.append((method, path, kw))
        if self.error is not None:
            raise self.error
        return self.response


def cm(
    finalizers: list[str] | None = None,
    *,
    rv: str = "42",
    deleting: bool = False,
    namespace: str = "default",
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "cm", "namespace": namespace, "resourceVersion": rv}
    if finalizers is not None:
        meta["finalizers"] = finalizers
    if deleting:
        meta["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": "v"}}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def status_422(
    message: str, causes: list[dict[str, str]] | None = None, name: str = ""
) -> ApiError:
    """The error the transport raises for a 422 Status body shaped like the apiserver's."""
    details: dict[str, Any] = {}
    if name:
        details.update(name=name, kind="configmaps")
    if causes:
        details["causes"] = causes
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Invalid",
        "details": details,
        "code": 422,
    }
    return error_from(422, "Unprocessable Entity", json.dumps(body).encode(), "PATCH", PATH)


#: What kube-apiserver really answers when a JSON patch ``test`` op fails: patch.go wraps the
#: json-patch error with ``NewGenericServerResponse(422, ..., isUnexpectedResponse=false)``, which
#: replaces the message with this generic text and drops the original error (no causes).
REAL_FAILED_TEST = "the server rejected our request due to an error in our request"

#: A field-validation 422 (has causes); the object's name happens to contain "test".
VALIDATION_ERROR_ON_TEST_NAMED_OBJECT = (
    'ConfigMap "test-cm" is invalid: metadata.finalizers[0]: Invalid value: "Example.com/X": '
    "name part must consist of alphanumeric characters"
)


# -- pure helpers -------------------------------------------------------------------------


def test_contains_finalizer() -> None:
    assert contains_finalizer(cm([OURS]), OURS)
    assert contains_finalizer(cm([THEIRS, OURS]), OURS)
    assert not contains_finalizer(cm([THEIRS]), OURS)
    assert not contains_finalizer(cm(), OURS)
    assert not contains_finalizer({"metadata": {"finalizers": None}}, OURS)
    assert not contains_finalizer({}, OURS)


def test_add_finalizer() -> None:
    o = cm()
    assert add_finalizer(o, OURS) is True
    assert o["metadata"]["finalizers"] == [OURS]
    assert add_finalizer(o, OURS) is False
    assert o["metadata"]["finalizers"] == [OURS]
    o2 = cm([THEIRS])
    assert add_finalizer(o2, OURS) is True
    assert o2["metadata"]["finalizers"] == [THEIRS, OURS]
    bare: dict[str, Any] = {}
    assert add_finalizer(bare, OURS) is True
    assert bare == {"metadata": {"finalizers": [OURS]}}


@pytest.mark.parametrize("obj", [{"metadata": {"finalizers": None}}, {"metadata": None}])
def test_add_finalizer_tolerates_null_finalizers_and_metadata(obj: dict[str, Any]) -> None:
    """``contains_finalizer``/``remove_finalizer`` treat null like absent; ``add_finalizer`` must too."""
    assert contains_finalizer(obj, OURS) is False
    assert add_finalizer(obj, OURS) is True
    assert obj["metadata"]["finalizers"] == [OURS]


def test_remove_finalizer() -> None:
    o = cm([THEIRS, OURS, "z.io/last", OURS])
    assert remove_finalizer(o, OURS) is True
    assert o["metadata"]["finalizers"] == [THEIRS, "z.io/last"]
    assert remove_finalizer(o, OURS) is False
    assert o["metadata"]["finalizers"] == [THEIRS, "z.io/last"]
    assert remove_finalizer(cm(), OURS) is False
    assert remove_finalizer({}, OURS) is False


# -- ensure_finalizer ---------------------------------------------------------------------


def test_ensure_adds_to_an_empty_list_with_a_resource_version_test() -> None:
    patched = cm([OURS], rv="43")
    t = FakeTransport(response=patched)
    obj = cm()
    result = run(ensure_finalizer(t, CONFIGMAPS, obj, OURS))
    assert result is patched
    assert t.calls == [
        (
            "PATCH",
            PATH,
            {
                "body": [
                    {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
                    {"op": "add", "path": "/metadata/finalizers", "value": [OURS]},
                ],
                "content_type": JSON_PATCH,
            },
        )
    ]
    assert obj == cm()  # the input is not mutated


def test_ensure_adds_when_finalizers_is_an_empty_list() -> None:
    t = FakeTransport(response={})
    run(ensure_finalizer(t, CONFIGMAPS, cm([]), OURS))
    ops = t.calls[0][2]["body"]
    assert ops[1] == {"op": "add", "path": "/metadata/finalizers", "value": [OURS]}


def test_ensure_appends_to_existing_finalizers() -> None:
    t = FakeTransport(response={})
    obj = cm([THEIRS])
    run(ensure_finalizer(t, CONFIGMAPS, obj, OURS))
    (method, path, kw) = t.calls[0]
    assert (method, path) == ("PATCH", PATH)
    assert kw["content_type"] == JSON_PATCH
    assert kw["body"] == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
        {"op": "add", "path": "/metadata/finalizers/-", "value": OURS},
    ]
    assert obj["metadata"]["finalizers"] == [THEIRS]


def test_ensure_is_a_no_op_when_present() -> None:
    t = FakeTransport()
    obj = cm([THEIRS, OURS])
    assert run(ensure_finalizer(t, CONFIGMAPS, obj, OURS)) is obj
    assert t.calls == []


@pytest.mark.parametrize("finalizers", [None, [], [THEIRS]])
def test_ensure_never_adds_to_an_object_being_deleted(finalizers: list[str] | None) -> None:
    t = FakeTransport()
    obj = cm(finalizers, deleting=True)
    before = copy.deepcopy(obj)
    assert run(ensure_finalizer(t, CONFIGMAPS, obj, OURS)) is obj
    assert t.calls == []
    assert obj == before


def test_ensure_on_a_cluster_scoped_grouped_resource() -> None:
    t = FakeTransport(response={})
    obj = {"metadata": {"name": "w1", "resourceVersion": "7"}}
    run(ensure_finalizer(t, WIDGETS, obj, OURS))
    assert t.calls[0][1] == "/apis/example.com/v1/widgets/w1"


def test_ensure_failed_test_op_becomes_conflict() -> None:
    err = ApiError(
        422,
        "Unprocessable Entity",
        "the server rejected our request due to an error in our request: testing value /metadata/resourceVersion failed: test operation failed",
    )
    t = FakeTransport(error=err)
    with pytest.raises(Conflict) as info:
        run(ensure_finalizer(t, CONFIGMAPS, cm(), OURS))
    assert info.value.__cause__ is err
    assert "configmaps cm changed meanwhile" in str(info.value)


def test_ensure_real_apiserver_failed_test_becomes_conflict() -> None:
    err = status_422(REAL_FAILED_TEST)
    t = FakeTransport(error=err)
    with pytest.raises(Conflict) as info:
        run(ensure_finalizer(t, CONFIGMAPS, cm(), OURS))
    assert info.value.__cause__ is err


def test_ensure_validation_error_is_not_mistaken_for_a_failed_test() -> None:
    err = status_422(
        VALIDATION_ERROR_ON_TEST_NAMED_OBJECT,
        causes=[
            {
                "reason": "FieldValueInvalid",
                "message": "Invalid value",
                "field": "metadata.finalizers[0]",
            }
        ],
        name="test-cm",
    )
    t = FakeTransport(error=err)
    obj = cm()
    obj["metadata"]["name"] = "test-cm"
    with pytest.raises(ApiError) as info:
        run(ensure_finalizer(t, CONFIGMAPS, obj, "Example.com/X"))
    assert info.value is err
    assert not isinstance(info.value, Conflict)


def test_ensure_conflict_passes_through() -> None:
    t = FakeTransport(error=Conflict("stale"))
    with pytest.raises(Conflict, match="stale"):
        run(ensure_finalizer(t, CONFIGMAPS, cm(), OURS))


@pytest.mark.parametrize(
    "err",
    [
        status_422(
            'ConfigMap "cm" is invalid: metadata.finalizers: Forbidden: no new finalizers can be added '
            "if the object is being deleted",
            causes=[
                {
                    "reason": "FieldValueForbidden",
                    "message": "Forbidden: no new finalizers can be added",
                    "field": "metadata.finalizers",
                }
            ],
            name="cm",
        ),
        Forbidden("configmaps is forbidden"),
        NotFound("gone"),
        ApiError(500, "Internal Server Error", "boom"),
    ],
)
def test_ensure_other_errors_pass_through(err: ApiError) -> None:
    t = FakeTransport(error=err)
    with pytest.raises(ApiError) as info:
        run(ensure_finalizer(t, CONFIGMAPS, cm(), OURS))
    assert info.value is err


# -- release_finalizer --------------------------------------------------------------------


def test_release_removes_only_ours_at_the_right_index() -> None:
    patched = cm([THEIRS, "z.io/last"], rv="43", deleting=True)
    t = FakeTransport(response=patched)
    obj = cm([THEIRS, OURS, "z.io/last"], deleting=True)
    assert run(release_finalizer(t, CONFIGMAPS, obj, OURS)) is patched
    assert t.calls == [
        (
            "PATCH",
            PATH,
            {
                "body": [
                    {"op": "test", "path": "/metadata/finalizers/1", "value": OURS},
                    {"op": "remove", "path": "/metadata/finalizers/1"},
                ],
                "content_type": JSON_PATCH,
            },
        )
    ]
    assert obj["metadata"]["finalizers"] == [THEIRS, OURS, "z.io/last"]  # input not mutated


def test_release_first_entry() -> None:
    t = FakeTransport(response={})
    run(release_finalizer(t, CONFIGMAPS, cm([OURS, THEIRS]), OURS))
    ops = t.calls[0][2]["body"]
    assert ops == [
        {"op": "test", "path": "/metadata/finalizers/0", "value": OURS},
        {"op": "remove", "path": "/metadata/finalizers/0"},
    ]
    assert not any(op["op"] == "replace" for op in ops)


def test_release_removes_every_copy_of_ours_from_the_highest_index_down() -> None:
    t = FakeTransport(response={})
    run(release_finalizer(t, CONFIGMAPS, cm([OURS, THEIRS, OURS], deleting=True), OURS))
    assert t.calls[0][2]["body"] == [
        {"op": "test", "path": "/metadata/finalizers/2", "value": OURS},
        {"op": "remove", "path": "/metadata/finalizers/2"},
        {"op": "test", "path": "/metadata/finalizers/0", "value": OURS},
        {"op": "remove", "path": "/metadata/finalizers/0"},
    ]


def test_release_is_guarded_by_uid_and_entries_never_by_resource_version() -> None:
    """A handler that writes its object during DELETING moves the resourceVersion; the release
    must still apply. The uid test keeps it off a namesake created since."""
    obj = cm([THEIRS, OURS], deleting=True)
    obj["metadata"]["uid"] = "u-1"
    t = FakeTransport(response={})
    run(release_finalizer(t, CONFIGMAPS, obj, OURS))
    ops = t.calls[0][2]["body"]
    assert ops[0] == {"op": "test", "path": "/metadata/uid", "value": "u-1"}
    assert not any(op["path"] == "/metadata/resourceVersion" for op in ops)


def test_release_applies_after_the_handler_wrote_the_object() -> None:
    """Through the fake apiserver's real JSON-patch semantics: the status write moved the
    resourceVersion past the one the handler was given, and the release still goes through."""
    from declop.testing.fakes.client import FakeApiServer

    server = FakeApiServer()
    created = run(server.request("POST", "/api/v1/namespaces/default/configmaps",
                                 body={"apiVersion": "v1", "kind": "ConfigMap",
                                       "metadata": {"name": "cm", "namespace": "default", "finalizers": [OURS, OURS]}}))
    seen = copy.deepcopy(created)  # what the handler was called with
    run(server.request("PATCH", PATH, body={"metadata": {"labels": {"cleaned": "yes"}}},
                       content_type="application/merge-patch+json"))
    after = run(release_finalizer(server, CONFIGMAPS, seen, OURS))
    assert after is not None and not after["metadata"].get("finalizers")
    assert after["metadata"]["labels"] == {"cleaned": "yes"}


@pytest.mark.parametrize("finalizers", [None, [], [THEIRS]])
def test_release_is_a_no_op_when_absent(finalizers: list[str] | None) -> None:
    t = FakeTransport()
    obj = cm(finalizers, deleting=True)
    assert run(release_finalizer(t, CONFIGMAPS, obj, OURS)) is obj
    assert t.calls == []


def test_release_not_found_means_gone() -> None:
    t = FakeTransport(error=NotFound('configmaps "cm" not found'))
    assert run(release_finalizer(t, CONFIGMAPS, cm([OURS], deleting=True), OURS)) is None
    assert len(t.calls) == 1


def test_release_failed_test_op_becomes_conflict() -> None:
    err = ApiError(
        422, "Unprocessable Entity", "the server rejected our request: Test operation failed"
    )
    t = FakeTransport(error=err)
    with pytest.raises(Conflict) as info:
        run(release_finalizer(t, CONFIGMAPS, cm([THEIRS, OURS], deleting=True), OURS))
    assert info.value.__cause__ is err
    assert info.value.status == 409


def test_release_real_apiserver_failed_test_becomes_conflict() -> None:
    err = status_422(REAL_FAILED_TEST)
    t = FakeTransport(error=err)
    with pytest.raises(Conflict) as info:
        run(release_finalizer(t, CONFIGMAPS, cm([THEIRS, OURS], deleting=True), OURS))
    assert info.value.__cause__ is err


def test_release_other_errors_pass_through() -> None:
    err = Forbidden("configmaps is forbidden")
    t = FakeTransport(error=err)
    with pytest.raises(Forbidden) as info:
        run(release_finalizer(t, CONFIGMAPS, cm([OURS], deleting=True), OURS))
    assert info.value is err
