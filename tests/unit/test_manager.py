"""declop.manager: what start does before it touches the apiserver (no cluster here)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from declop.manager import Manager, Options


class _Stop(Exception):
    pass


@pytest.mark.parametrize(("given", "expected"), [(0.001, 0.001), (0.0005, 0.0005), (None, "unchanged")])
def test_start_sets_the_interpreter_switch_interval(monkeypatch: pytest.MonkeyPatch, given: float | None, expected: object) -> None:
    """A thread computing holds the loop's next step up to the switch interval: the manager
    sets it to 1 ms by default (Python's is 5 ms), or leaves it alone with None."""
    before = sys.getswitchinterval()

    async def no_cluster(self: Manager) -> None:
        raise _Stop()

    monkeypatch.setattr(Manager, "setup", no_cluster)
    try:
        sys.setswitchinterval(0.005)
        with pytest.raises(_Stop):
            asyncio.run(Manager(None, options=Options(switch_interval=given)).start())
        assert sys.getswitchinterval() == pytest.approx(0.005 if expected == "unchanged" else expected)
    finally:
        sys.setswitchinterval(before)


def test_the_default_is_one_millisecond() -> None:
    assert Options().switch_interval == 0.001
