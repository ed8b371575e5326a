"""ShardScope.detect: one probe LIST decides whether the apiserver filters by shard."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from declop.cache.sharding import ShardScope
from declop.cache.stats import InformerStats
from declop.errors import ApiError
from declop.leases.hashing import ShardFilter, split


class _Probe:
    """A transport that answers the probe with ``answer`` (raised when it is an exception)."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.params: dict[str, Any] = {}

    async def request(self, verb: str, path: str, *, params: dict[str, Any], **_: Any) -> Any:
        self.params = params
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


def _scope() -> ShardScope:
    return ShardScope(ShardFilter("uid", (split(2)[0],)), "", InformerStats(), {})


def _detect(answer: Any) -> ShardScope:
    scope = _scope()
    probe = _Probe(answer)
    asyncio.run(scope.detect(probe, "/api/v1/pods"))  # type: ignore[arg-type]
    assert probe.params["limit"] == 1 and probe.params["shardSelector"] == scope.filter.selector  # type: ignore[union-attr]
    return scope


def test_shard_info_in_the_answer_means_the_apiserver_filters() -> None:
    assert _detect({"metadata": {"shardInfo": {"selector": "x"}}, "items": []}).mode == "server"


def test_an_answer_without_shard_info_means_filtering_here() -> None:
    assert _detect({"metadata": {}, "items": []}).mode == "client"


@pytest.mark.parametrize("status", [400, 422])
def test_an_apiserver_that_refuses_the_parameter_means_filtering_here(status: int) -> None:
    assert _detect(ApiError(status, "BadRequest", "unknown parameter shardSelector")).mode == "client"


@pytest.mark.parametrize("status", [401, 403, 429, 500, 503])
def test_any_other_failure_raises_and_decides_nothing(status: int) -> None:
    scope = _scope()
    with pytest.raises(ApiError):
        asyncio.run(scope.detect(_Probe(ApiError(status, "Other")), "/api/v1/pods"))  # type: ignore[arg-type]
    assert scope.mode == "" and scope.undetected
