"""Documentation gaps a Kopf user's port found (issue 41), each held by a test so it cannot come back:
``@declop.reconciler(name=)`` is documented where a user looks (the decorator's help and the
contract), and contract.md §8 says that the cache can lag one's own last write when an older event
of another writer wakes the handler, with the fixes."""

from __future__ import annotations

from pathlib import Path

import declop

DOCS = Path(__file__).resolve().parent.parent / "docs"


def section(page: str, heading: str) -> str:
    text = (DOCS / page).read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end != -1 else None]


def test_name_is_documented_in_the_decorators_help_and_the_contract() -> None:
    assert "name=" in (declop.reconciler.__doc__ or "")
    assert "``name=`` names the controller" in (declop.reconciler.__doc__ or "")
    arguments = section("contract.md", "## 2. Arguments")
    assert "`name=` names the controller" in arguments and "pass name= to tell them apart" in arguments


def test_the_contract_says_the_cache_can_lag_your_own_last_write_and_how_to_live_with_it() -> None:
    not_guaranteed = section("contract.md", "## 8. Not guaranteed")
    assert "The cache can lag your own last write even when an event woke you" in not_guaranteed
    for fix in ("idempotent", "resourceVersion", "read=obj", "client.live.get(request)"):
        assert fix in not_guaranteed, fix
