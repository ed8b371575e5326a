"""declop.reconcile._leaving: the LIST that finds objects which left a labels= filter with our
finalizer while no watch of ours saw them go."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from declop.cache.listing import METADATA_LIST_ACCEPT
from declop.errors import ApiError
from declop.kube.keys import Request
from declop.reconcile import _leaving
from declop.reconcile._filters import in_filter
from declop.reconcile._leaving import scan

FIN = "example.com/cleanup"
PATH = "/api/v1/namespaces/ns/configmaps"


def _cm(name: str, app: str, finalizers: list[str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": {"app": app}, "finalizers": finalizers}}


class Pages:
    """Serves ``items`` two per page; ``failures`` answers (exceptions) come first."""

    def __init__(self, items: list[dict[str, Any]], failures: list[BaseException] = ()) -> None:  # type: ignore[assignment]
        self.items, self.failures = items, list(failures)
        self.requests: list[dict[str, Any]] = []

    async def request(self, method: str, path: str, *, params: Any = None, timeout: float = 0, lane: str = "", accept: Any = None) -> Any:
        assert (method, path, lane) == ("GET", PATH, "informer")
        self.requests.append({**(params or {}), "accept": accept})
        if self.failures:
            raise self.failures.pop(0)
        if "limit" not in (params or {}):
            return {"metadata": {}, "items": self.items}
        start = int((params or {}).get("continue") or 0)
        more = start + 2 < len(self.items)
        return {"metadata": {"continue": str(start + 2)} if more else {}, "items": self.items[start : start + 2]}


def _scan(transport: Pages, metadata_only: bool = True) -> tuple[int, list[tuple[Request, str]]]:
    found: list[tuple[Request, str]] = []
    n = asyncio.run(scan(transport, [PATH], FIN, in_filter("app=web", ""), metadata_only, lambda k, u: found.append((k, u)), "c"))
    return n, found


ITEMS = [
    _cm("in-filter", "web", [FIN]),  # still selected: its own watch's
    _cm("left", "db", ["other.io/keep", FIN]),
    _cm("never-ours", "db", ["other.io/keep"]),
    _cm("left-too", "db", [FIN]),
    _cm("bare", "db", []),
]


def test_only_objects_outside_the_filter_with_our_finalizer_are_found_across_pages() -> None:
    t = Pages(ITEMS)
    n, found = _scan(t)
    assert found == [(Request("ns", "left"), "uid-left"), (Request("ns", "left-too"), "uid-left-too")] and n == 2
    assert [r.get("continue") for r in t.requests] == [None, "2", "4"]
    assert all(r["limit"] == _leaving.PAGE and r["accept"] == METADATA_LIST_ACCEPT for r in t.requests)


def test_a_fields_filter_lists_whole_objects() -> None:
    t = Pages(ITEMS)
    _scan(t, metadata_only=False)
    assert {r["accept"] for r in t.requests} == {None}


def test_an_expired_continue_token_lists_everything_in_one_request() -> None:
    class Expiring(Pages):
        async def request(self, method: str, path: str, **kw: Any) -> Any:
            if (kw.get("params") or {}).get("continue"):
                self.requests.append(dict(kw["params"]))
                raise ApiError(410, "Expired", "continue token expired")
            return await super().request(method, path, **kw)

    t = Expiring(ITEMS)
    n, found = _scan(t)
    assert n == 2 and len(found) == 2  # nothing twice: the first page's objects were dropped
    assert "limit" not in t.requests[-1]


def test_a_failed_list_is_retried_with_a_growing_capped_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []

    async def sleep(delay: float) -> None:
        slept.append(delay)

    monkeypatch.setattr(_leaving.asyncio, "sleep", sleep)
    monkeypatch.setattr(_leaving, "RETRY_MAX", 3.0)
    errors: list[BaseException] = [ApiError(403, "Forbidden", "no list"), OSError("reset"), ApiError(500, "x", "y"), ApiError(503, "x", "y")]
    n, found = _scan(Pages(ITEMS, errors))
    assert n == 2 and slept == [1.0, 2.0, 3.0, 3.0]
