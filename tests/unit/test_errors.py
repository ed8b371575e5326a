"""errors.py's drawings name every exception class of declop, each under its own first base."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import declop
import declop.errors

#: a drawn line: the tree's branch, then the class name
BRANCH = re.compile(r"[├└]── (\w+)")


def drawn() -> set[tuple[str, str]]:
    """(class, parent) for every name in the docstring's two drawings."""
    pairs: set[tuple[str, str]] = set()
    stack: list[tuple[int, str]] = []
    for line in (declop.errors.__doc__ or "").splitlines():
        root = re.fullmatch(r" {4}(\w+)", line)
        if root:
            stack = [(0, root.group(1))]
            if root.group(1) != "Exception":
                pairs.add((root.group(1), "Exception"))
            continue
        found = BRANCH.search(line)
        if found is None or not stack:
            continue
        column = found.start(1)
        while stack and stack[-1][0] >= column:
            stack.pop()
        pairs.add((found.group(1), stack[-1][1]))
        stack.append((column, found.group(1)))
    return pairs


def defined() -> set[tuple[str, str]]:
    """(class, first base) for every exception class a declop module defines."""
    classes: dict[int, type] = {}
    for info in pkgutil.walk_packages(declop.__path__, "declop."):
        if info.name == "declop.__main__":
            continue
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__.split(".")[0] == "declop":
                classes[id(obj)] = obj
    return {(c.__name__, c.__bases__[0].__name__) for c in classes.values()}


def test_the_drawings_read_as_trees() -> None:
    assert ("NotFound", "ApiError") in drawn()
    assert ("InvalidResult", "TerminalError") in drawn()
    assert ("TooDeep", "ValueError") in drawn()


def test_every_exception_class_is_drawn_under_its_base_and_nothing_else_is() -> None:
    pairs, real = drawn(), defined()
    assert sorted(real - pairs) == [], "defined but not drawn (or drawn under another parent) in errors.py"
    assert sorted(pairs - real - {("ValueError", "Exception"), ("RuntimeError", "Exception")}) == [], "drawn but not defined"


def test_rejected_is_a_declop_error() -> None:
    assert issubclass(declop.Rejected, declop.errors.DeclopError)
