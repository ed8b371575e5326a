"""ControlPlane's extra apiserver flags and feature gates, checked before anything starts, and
the plugin's DECLOP_TEST_FEATURE_GATES. Starting with them: tests/integration/test_sharded_list_watch.py
(the gate on) and tests/integration/test_controlplane.py (an unknown gate)."""

from __future__ import annotations

import pytest

from declop.testing.cluster.controlplane import ControlPlane
from declop.testing.cluster.plugin import feature_gates_from_env


def args_of(cp: ControlPlane) -> list[str]:
    return cp._extra_apiserver_args()


def test_gates_become_one_sorted_flag_before_the_extra_flags() -> None:
    cp = ControlPlane(feature_gates={"ShardedListAndWatch": True, "A": False}, apiserver_flags=["--v=2"])
    assert args_of(cp) == ["--feature-gates=A=false,ShardedListAndWatch=true", "--v=2"]
    assert args_of(ControlPlane()) == []


@pytest.mark.parametrize(
    "kw,message",
    [
        ({"apiserver_flags": ["v=2"]}, "must start with '--'"),
        ({"apiserver_flags": "--v=2"}, "a list of flags, not the string"),
        ({"feature_gates": {"X": "true"}}, "give a gate name and True or False"),
        ({"feature_gates": {"X": True}, "apiserver_flags": ["--feature-gates=Y=true"]}, "not both"),
    ],
)
def test_bad_flags_and_gates_are_refused_at_once(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ControlPlane(**kw)  # type: ignore[arg-type]


def test_feature_gates_from_env() -> None:
    assert feature_gates_from_env("") == {}
    assert feature_gates_from_env("ShardedListAndWatch=true, B=False") == {"ShardedListAndWatch": True, "B": False}
    with pytest.raises(pytest.UsageError, match="'B' is not Name=true or Name=false"):
        feature_gates_from_env("A=true,B")
