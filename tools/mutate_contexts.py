"""A pytest plugin for `make mutate`'s baseline (tools/mutate.py): names coverage's dynamic
context after the test running, ``<node id>|setup``, ``|run`` or ``|teardown``.

coverage's own ``dynamic_context = test_function`` names only the test function's frame: a
fixture's setup runs under the empty context, and so does code a collected coroutine's
``finally`` runs when the garbage collector closes it between two tests — which put the empty
context on nearly every queue line the world sweep runs. Named per phase, every line a test's
setup, call or teardown runs is that test's, and only what runs before the first test (imports,
collection) keeps the empty context. A line run later by the collector is charged to whichever
test was running then: more tests selected, never fewer.
"""

from __future__ import annotations

import coverage
import pytest


def _switch(item: pytest.Item, when: str) -> None:
    cov = coverage.Coverage.current()
    if cov is not None:
        cov.switch_context(f"{item.nodeid}|{when}")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _switch(item, "setup")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    _switch(item, "run")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    _switch(item, "teardown")
