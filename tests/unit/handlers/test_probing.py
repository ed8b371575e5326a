"""@declop.on_probe: registration, and Probes' cache, single flight, timeout and failures."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import declop
from declop.errors import RegistrationError
from declop.handlers.probing import Probes
from declop.lifecycle import Hook, make_hook
from declop.registry import Registry


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def probe(fn: Any, name: str | None = None, *, timeout: float = 1.0, cache: float = 10.0) -> Hook:
    return make_hook(fn, "probe", name=name, timeout=timeout, cache=cache)


async def call(hook: Hook) -> Any:
    if hook.is_async:
        return await hook.fn()
    return await asyncio.get_running_loop().run_in_executor(None, hook.fn)


# -- registration ---------------------------------------------------------------------------------


def test_the_decorator_returns_the_function_and_records_a_probe_hook() -> None:
    registry = Registry()

    def now(logger):
        return "t"

    async def queue(**_):
        return 4

    assert declop.on_probe(registry=registry)(now) is now
    assert declop.on_probe(queue, name="depth", timeout=1, cache=0, registry=registry) is queue
    hooks = [h for h in registry.hooks if h.kind == "probe"]
    assert [(h.name, h.is_async, h.timeout, h.cache, h.wants) for h in hooks] == [
        ("now", False, 5.0, 10.0, frozenset({"logger"})),
        ("depth", True, 1.0, 0.0, None),
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"timeout": 0}, r"^@declop.on_probe 'f': timeout= must be > 0"),
        ({"cache": -1}, r"^@declop.on_probe 'f': cache= must be a number of seconds >= 0, got -1$"),
        ({"timeout": "5"}, r"timeout= must be a number of seconds >= 0, got '5'$"),
        ({"id": "now"}, r"^@on_probe got an unknown option id=: use name="),
    ],
)
def test_misuse_is_one_line(kwargs: dict[str, Any], message: str) -> None:
    def f():
        return 1

    with pytest.raises(RegistrationError, match=message):
        declop.on_probe(registry=Registry(), **kwargs)(f)


def test_a_probe_with_an_unknown_argument_is_refused() -> None:
    def f(obj):
        return 1

    with pytest.raises(RegistrationError, match="takes an unknown argument 'obj'"):
        declop.on_probe(f, registry=Registry())


def test_probe_options_belong_to_probes_only() -> None:
    with pytest.raises(RegistrationError, match="options of @declop.on_probe only"):
        make_hook(lambda: None, "startup", timeout=3)


def test_two_probes_of_one_name_are_refused() -> None:
    registry = Registry()
    declop.on_probe(lambda: 1, name="x", registry=registry)
    with pytest.raises(RegistrationError, match="a probe hook named 'x' is already registered"):
        declop.on_probe(lambda: 2, name="x", registry=registry)


# -- Probes ---------------------------------------------------------------------------------------


def test_values_are_cached_for_the_period_then_called_again() -> None:
    clock = Clock()
    count = iter(range(100))
    probes = Probes([probe(lambda: next(count), "n", cache=10)], call, clock=clock)

    async def main() -> list[Any]:
        seen = [await probes.report()]
        clock.now += 9.9
        seen.append(await probes.report())
        clock.now += 0.2
        seen.append(await probes.report())
        return seen

    assert asyncio.run(main()) == [({"n": 0}, []), ({"n": 0}, []), ({"n": 1}, [])]
    assert probes.calls == {"n": 2}


def test_concurrent_requests_share_one_call() -> None:
    release = asyncio.Event

    async def main() -> tuple[list[Any], dict[str, int]]:
        gate = release()

        async def slow():
            await gate.wait()
            return "v"

        probes = Probes([probe(slow, "slow")], call, clock=Clock())
        requests = [asyncio.ensure_future(probes.report()) for _ in range(5)]
        await asyncio.sleep(0.01)
        gate.set()
        return await asyncio.gather(*requests), probes.calls

    results, calls = asyncio.run(main())
    assert results == [({"slow": "v"}, [])] * 5
    assert calls == {"slow": 1}


def test_a_probe_that_raises_is_named_never_its_error_and_is_cached_too(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()

    def broken():
        raise RuntimeError("secret token abc123 rejected")

    probes = Probes([probe(broken, "broken"), probe(lambda: 7, "fine")], call, clock=clock)

    async def main() -> list[Any]:
        return [await probes.report(), await probes.report()]

    first, second = asyncio.run(main())
    assert first == second == ({"fine": 7}, ["broken"])
    assert "abc123" not in repr(first)
    assert probes.calls == {"broken": 1, "fine": 1}  # the failure is reused for the cache period
    assert any(r.message == "Probe failed" and r.exc_info for r in caplog.records)


def test_an_async_probe_past_its_timeout_fails_and_is_cancelled() -> None:
    cancelled = []

    async def hangs():
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    probes = Probes([probe(hangs, "hangs", timeout=0.05)], call, clock=Clock())

    async def main() -> Any:
        result = await asyncio.wait_for(probes.report(), 5)
        await asyncio.sleep(0.01)
        return result

    assert asyncio.run(main()) == ({}, ["hangs"])
    assert cancelled == [True]


def test_a_stuck_plain_probe_is_not_called_again_while_its_thread_runs() -> None:
    clock = Clock()
    release = threading.Event()
    entered = []

    def stuck():
        entered.append(True)
        release.wait(10)
        return "late"

    probes = Probes([probe(stuck, "stuck", timeout=0.05, cache=0)], call, clock=clock)

    async def main() -> list[Any]:
        seen = [await probes.report(), await probes.report(), await probes.report()]
        seen.append((len(entered), probes.calls["stuck"]))
        release.set()
        while not probes._states["stuck"].call.done():  # the thread returns
            await asyncio.sleep(0.01)
        seen.append(await probes.report())
        return seen

    seen = asyncio.run(main())
    assert seen[:3] == [({}, ["stuck"])] * 3
    assert seen[3] == (1, 1)  # one thread, however often asked
    assert seen[4] == ({"stuck": "late"}, []) and probes.calls["stuck"] == 2


def test_a_value_that_is_not_json_is_a_failure() -> None:
    probes = Probes([probe(lambda: object(), "obj"), probe(lambda: {"a": [1, "b"]}, "doc")], call, clock=Clock())
    assert asyncio.run(probes.report()) == ({"doc": {"a": [1, "b"]}}, ["obj"])


def test_only_probe_hooks_are_run() -> None:
    other = make_hook(lambda: None, "startup")
    probes = Probes([other, probe(lambda: 1, "p")], call)
    assert [h.name for h in probes.hooks] == ["p"]
