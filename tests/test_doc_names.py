"""Every dotted ``declop.…`` name in the docs, the README and the examples resolves — to a module or
an attribute, without a DeprecationWarning — so a reader who copies one gets the current home.
"""

from __future__ import annotations

import importlib
import re
import warnings
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([*ROOT.glob("docs/*.md"), ROOT / "README.md", *ROOT.glob("examples/**/*.py"), *ROOT.glob("examples/**/*.md")])
NAME = re.compile(r"(?<![\w./-])declop(?:\.[A-Za-z_]\w*)+")
#: dotted words that are not Python names: a finalizer, label keys, a placeholder
NOT_PYTHON = {"declop.example", "declop.mistakes", "declop.name", "declop.X"}


def resolve(dotted: str) -> Any:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def names(page: Path) -> list[str]:
    return sorted(set(NAME.findall(page.read_text())) - NOT_PYTHON)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_declop_name_on_the_page_resolves(page: Path) -> None:
    unresolved = []
    for dotted in names(page):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                resolve(dotted)
            except (ImportError, AttributeError, DeprecationWarning) as e:
                unresolved.append(f"{dotted}: {e}")
    assert unresolved == []


def test_the_check_sees_names_and_rejects_old_ones() -> None:
    assert {"declop.reconciler", "declop.errors.ApiError"} <= set(NAME.findall("`declop.reconciler`, declop.errors.ApiError"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError):
            resolve("declop.Manager")
        with pytest.raises(AttributeError):
            resolve("declop.reconcile.client.NoSuchThing")
