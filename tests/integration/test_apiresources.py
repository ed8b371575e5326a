"""declop/kube/apiresources.py — the standard resources `declop rbac` reads names against when no
cluster answers — is what a live kube-apiserver's discovery serves, row for row and in server
order (names, singulars, kinds, short names, scope, verbs, subresources). When this fails, the
Kubernetes declop tests with changed: regenerate the table with tools/apiresources.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from declop.kube.apiresources import RESOURCES
from declop.kube.catalog import discover

pytestmark = pytest.mark.integration


def test_the_standard_table_is_the_live_apiservers_discovery(control_plane: Any) -> None:
    served = asyncio.run(discover(control_plane.configuration()))
    # Kubernetes' own groups (a new one is *.k8s.io); CRDs other tests installed are not
    standard_groups = {r.group for r in RESOURCES}
    live = [r for r in served if r.group in standard_groups or r.group.endswith(".k8s.io")]
    assert [r for r in live if r not in RESOURCES] == [], "served but not in the table: run tools/apiresources.py"
    assert [r for r in RESOURCES if r not in live] == [], "in the table but not served: run tools/apiresources.py"
    assert live == list(RESOURCES)  # the same order: a bare name's preferred version depends on it
