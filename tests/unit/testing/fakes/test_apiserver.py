"""declop.testing.fakes.apiserver: the fake apiserver refuses the Events the real one refuses
(kubernetes' ValidateEventCreate for events.k8s.io/v1), so the shared EventRecorder meets the
same answers in a unit test as in a cluster."""

from __future__ import annotations

import pytest

from declop.testing.fakes.apiserver import event_refusals

GOOD = {
    "metadata": {"name": "c.18f2a", "namespace": "ns"},
    "eventTime": "2026-05-01T12:00:00.000000Z",
    "reportingController": "declop.io/widget",
    "reportingInstance": "declop-host",
    "action": "Reconcile",
    "reason": "Seen",
    "type": "Normal",
    "note": "ok",
    "regarding": {"kind": "ConfigMap", "name": "c", "namespace": "ns"},
}


def test_what_the_recorder_sends_is_accepted() -> None:
    assert event_refusals(GOOD, "ns") == []
    cluster_scoped = {**GOOD, "regarding": {"kind": "Node", "name": "n"}}
    assert event_refusals(cluster_scoped, "default") == []


@pytest.mark.parametrize(
    "change, words",
    [
        ({"reason": ""}, "reason: Required value"),
        ({"reason": "R" * 129}, "reason: Invalid value"),
        ({"action": ""}, "action: Required value"),
        ({"type": "Info"}, "type: Invalid value"),
        ({"eventTime": None}, "eventTime: Required value"),
        ({"reportingController": "declop.io/_x"}, "reportingController: Invalid value"),
        ({"reportingController": "declop.io/" + "x" * 64}, "reportingController: Invalid value"),
        ({"reportingInstance": "i" * 129}, "reportingInstance: Invalid value"),
        ({"note": "n" * 1025}, "message: Invalid value"),
        ({"metadata": {"name": "Upper.1"}}, "metadata.name: Invalid value"),
    ],
)
def test_what_the_apiserver_refuses_is_refused(change: dict, words: str) -> None:
    assert any(words in r for r in event_refusals({**GOOD, **change}, "ns"))


def test_a_cluster_scoped_object_s_event_lives_in_default() -> None:
    cluster_scoped = {**GOOD, "regarding": {"kind": "Node", "name": "n"}}
    assert any("does not match event.namespace" in r for r in event_refusals(cluster_scoped, "ns"))
