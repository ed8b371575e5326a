"""The handlers' client (declop.reconcile.client), for what a typed resource adds: a typed
``patch_status`` sends the merge patch of only what changed, and nothing when nothing did. The
fake clients are declop's own Client/AsyncClient over an in-memory apiserver, so this is the
real code path up to the HTTP request."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from declop.kube.keys import Request
from declop.testing.fake import FakeClient
from declop.typed.model import CustomResource


class DialStatus(BaseModel):
    level: int = 0
    observedGeneration: int | None = None


class Dial(CustomResource, group="example.com", version="v1", kind="Dial"):
    spec: dict[str, Any] = {}
    status: DialStatus | None = None


KEY = Request("default", "d")
STORED = {"apiVersion": "example.com/v1", "kind": "Dial", "metadata": {"name": "d", "namespace": "default"},
          "spec": {}, "status": {"level": 2, "observedGeneration": 1, "other": "kept"}}


def client() -> FakeClient:
    return FakeClient([STORED], primary="dials.example.com", request=KEY)


def test_a_typed_status_sends_only_the_changed_fields() -> None:
    c = client()
    returned = c.patch_status(KEY, DialStatus(level=3, observedGeneration=1))
    assert [(w.verb, w.body, w.patch_type) for w in c.writes] == [("patch_status", {"status": {"level": 3}}, "merge")]
    assert returned["status"] == {"level": 3, "observedGeneration": 1, "other": "kept"}


def test_an_unchanged_typed_status_sends_nothing_and_returns_the_cached_object() -> None:
    c = client()
    returned = c.patch_status(KEY, DialStatus(level=2))
    assert c.writes == []
    assert returned == c.get(KEY) and returned["status"] == STORED["status"]
    returned["status"]["level"] = 9  # a copy: the cache keeps its own
    assert c.get(KEY)["status"]["level"] == 2


def test_the_whole_typed_object_may_be_passed() -> None:
    c = client()
    dial = Dial.model_validate(STORED)
    assert dial.status is not None
    dial.status.observedGeneration = 2
    c.patch_status(KEY, dial)
    assert [w.body for w in c.writes] == [{"status": {"observedGeneration": 2}}]


def test_the_async_client_does_the_same() -> None:
    c = client().aio
    asyncio.run(c.patch_status(KEY, DialStatus(level=5)))
    assert [w.body for w in c.writes] == [{"status": {"level": 5}}]


def test_a_typed_status_is_a_merge_patch_only() -> None:
    with pytest.raises(ValueError, match="a typed status is sent as a merge patch"):
        client().patch_status(KEY, DialStatus(level=5), type="json")


def test_a_dict_patch_is_sent_as_it_is() -> None:
    c = client()
    c.patch_status(KEY, {"status": {"level": 2}})
    assert [w.body for w in c.writes] == [{"status": {"level": 2}}]
