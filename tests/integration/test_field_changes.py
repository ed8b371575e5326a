"""Field changes (docs/changes.md) against a real apiserver: old/new/diff, field= and its
old=/new= filters, the snapshot written only after success, a stale cache after our own snapshot
write, and someone else editing or removing the snapshot annotation. ConfigMaps keep it short:
their ``data`` is part of the essence like a custom resource's ``spec``."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import kubernetes.client
import pytest

import declop
from declop.manager import Options
from declop.testing.cluster.runner import OperatorRunner, wait_for

pytestmark = pytest.mark.integration


def runner(registry: declop.registry.Registry, kubeconfig: str, namespace: str) -> OperatorRunner:
    return OperatorRunner(registry, kubeconfig=kubeconfig, options=Options(namespaces=(namespace,), grace_period=5))


@pytest.fixture
def core(control_plane: Any) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(control_plane.api_client())


def create(core: kubernetes.client.CoreV1Api, namespace: str, data: dict[str, str], name: str = "c") -> None:
    core.create_namespaced_config_map(namespace, {"metadata": {"name": name}, "data": data})


def edit(core: kubernetes.client.CoreV1Api, namespace: str, body: dict[str, Any], name: str = "c") -> None:
    core.patch_namespaced_config_map(name, namespace, body)


def snapshot(core: kubernetes.client.CoreV1Api, namespace: str, controller: str, name: str = "c") -> Any:
    text = (core.read_namespaced_config_map(name, namespace).metadata.annotations or {}).get(
        f"last-handled.declop.dev/{controller}"
    )
    return None if text is None else json.loads(text)


def test_old_new_diff_follow_the_changes_of_the_object(kubeconfig: str, namespace: str, core: Any) -> None:
    registry = declop.registry.Registry()
    calls: list[tuple[Any, Any, Any]] = []

    @declop.reconciler("configmaps", registry=registry)
    def changes(name: str, old: Any, new: Any, diff: Any) -> None:
        if name == "c":  # not the namespace's kube-root-ca.crt
            calls.append((old, new, diff))

    with runner(registry, kubeconfig, namespace):
        create(core, namespace, {"size": "1"})
        wait_for(lambda: snapshot(core, namespace, "changes") == {"data": {"size": "1"}}, 20, what="the first snapshot")
        assert calls[0] == (None, {"data": {"size": "1"}}, (("add", (), None, {"data": {"size": "1"}}),))
        edit(core, namespace, {"data": {"size": "2"}, "metadata": {"labels": {"team": "a"}}})
        wait_for(lambda: snapshot(core, namespace, "changes") == {"data": {"size": "2"}, "metadata": {"labels": {"team": "a"}}}, 20)
        changed = [c for c in calls if c[2]]
        assert changed[-1][2] == (
            ("change", ("data", "size"), "1", "2"),
            ("add", ("metadata",), None, {"labels": {"team": "a"}}),
        ), calls
        # our snapshot writes woke the reconciler (a reconciler: called), with nothing changed
        wait_for(lambda: calls[-1][0] == calls[-1][1] and calls[-1][2] == (), 20, what="a quiet call after our write")
    assert len(changed) == 2, calls  # each change was seen changed once: never again after its snapshot


def test_field_calls_only_on_that_fields_change_and_filters_pick_values(kubeconfig: str, namespace: str, core: Any) -> None:
    registry = declop.registry.Registry()
    sizes: list[tuple[Any, Any]] = []
    grown: list[tuple[Any, Any]] = []

    @declop.reconciler("configmaps", registry=registry, field="data.size")
    def size(old: Any, new: Any) -> None:
        sizes.append((old, new))

    @declop.reconciler("configmaps", registry=registry, field="data.size", new=lambda v: v is not None and int(v) > 5)
    def big(old: Any, new: Any) -> None:
        grown.append((old, new))

    with runner(registry, kubeconfig, namespace):
        create(core, namespace, {"size": "1", "colour": "red"})
        wait_for(lambda: sizes == [(None, "1")], 20, what="the first call")
        wait_for(lambda: snapshot(core, namespace, "big") == {"data": {"size": "1"}}, 20, what="big's turned-down change, handled")
        edit(core, namespace, {"data": {"colour": "blue"}})
        edit(core, namespace, {"data": {"size": "3"}})
        wait_for(lambda: snapshot(core, namespace, "big") == {"data": {"size": "3"}}, 20)
        edit(core, namespace, {"data": {"size": "8"}})
        wait_for(lambda: grown, 20, what="big's call")
        wait_for(lambda: snapshot(core, namespace, "size") == {"data": {"size": "8"}}, 20)
        edit(core, namespace, {"data": {"colour": "green"}})
        wait_for(lambda: (core.read_namespaced_config_map("c", namespace).data or {}).get("colour") == "green", 20)
    assert sizes == [(None, "1"), ("1", "3"), ("3", "8")]  # colour's changes called nobody
    assert grown == [("3", "8")]  # old is the value just before, as in Kopf: the turned-down 3 was handled


def test_a_failing_call_keeps_the_snapshot_and_the_retry_sees_the_same_old(kubeconfig: str, namespace: str, core: Any) -> None:
    registry = declop.registry.Registry()
    seen: list[tuple[Any, Any]] = []

    @declop.reconciler("configmaps", registry=registry, field="data.size")
    def flaky(old: Any, new: Any) -> None:
        seen.append((old, new))
        if len(seen) < 3:
            assert snapshot(core, namespace, "flaky") is None  # not written before a success
            raise RuntimeError("not yet")

    with runner(registry, kubeconfig, namespace):
        create(core, namespace, {"size": "1"})
        wait_for(lambda: snapshot(core, namespace, "flaky") == {"data": {"size": "1"}}, 30, what="the snapshot after success")
    assert seen == [(None, "1")] * 3


def test_a_stale_copy_after_our_own_write_does_not_call_again(
    kubeconfig: str, namespace: str, core: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The handler writes the object (a label) before it returns: that event comes back while the
    snapshot is being written, and the key runs again at once, often from a cache that has the
    label but not yet the snapshot. Each change must still be handled exactly once."""
    registry = declop.registry.Registry()
    calls: list[tuple[Any, Any]] = []
    lock = threading.Lock()

    @declop.reconciler("configmaps", registry=registry, field="data.size")
    def writes(old: Any, new: Any, client: Any, request: Any) -> None:
        with lock:
            calls.append((old, new))
        client.patch("configmaps", request, {"metadata": {"labels": {"handled": str(new)}}})

    caplog.set_level(logging.DEBUG, logger="declop.changes")

    def stale() -> int:
        return sum("behind our snapshot write" in r.getMessage() for r in caplog.records)

    with runner(registry, kubeconfig, namespace):
        create(core, namespace, {"size": "0"})
        n = 0
        while n < 5 or (not stale() and n < 60):  # until the race was run into (each change: ~1 in 5)
            wait_for(lambda: snapshot(core, namespace, "writes") == {"data": {"size": str(n)}}, 20)
            n += 1
            edit(core, namespace, {"data": {"size": str(n)}})
        wait_for(lambda: snapshot(core, namespace, "writes") == {"data": {"size": str(n)}}, 20)
        wait_for(lambda: core.read_namespaced_config_map("c", namespace).metadata.labels.get("handled") == str(n), 20)
    assert calls == [(None, "0"), *((str(i - 1), str(i)) for i in range(1, n + 1))]
    assert stale(), f"in {n} changes no reconcile read a copy behind our snapshot write: the case was not exercised"


def test_an_edited_or_removed_snapshot_reads_as_what_it_says_or_never_handled(
    kubeconfig: str, namespace: str, core: Any
) -> None:
    registry = declop.registry.Registry()
    calls: list[tuple[Any, Any]] = []
    key = "last-handled.declop.dev/watched"

    @declop.reconciler("configmaps", registry=registry, field="data.size")
    def watched(old: Any, new: Any) -> None:
        calls.append((old, new))

    with runner(registry, kubeconfig, namespace):
        create(core, namespace, {"size": "1"})
        wait_for(lambda: calls == [(None, "1")] and snapshot(core, namespace, "watched"), 20)
        edit(core, namespace, {"metadata": {"annotations": {key: None}}})  # removed: never handled
        wait_for(lambda: calls == [(None, "1"), (None, "1")] and snapshot(core, namespace, "watched"), 20)
        edit(core, namespace, {"metadata": {"annotations": {key: '{"data":{"size":"0"}}'}}})  # edited: taken as said
        wait_for(lambda: calls[-1] == ("0", "1") and snapshot(core, namespace, "watched") == {"data": {"size": "1"}}, 20)
        edit(core, namespace, {"metadata": {"annotations": {key: "garbage"}}})  # unreadable: never handled
        wait_for(lambda: calls[-1] == (None, "1") and len(calls) == 4, 20)
    assert calls == [(None, "1"), (None, "1"), ("0", "1"), (None, "1")]


def test_changes_made_while_the_operator_was_down_are_seen_once_as_one(kubeconfig: str, namespace: str, core: Any) -> None:
    """State, not events: after a restart the handler sees the last value it handled (kept on the
    object) against the present one, however many edits happened in between; what it handled
    before the restart is not handled again."""
    registry = declop.registry.Registry()
    calls: list[tuple[Any, Any]] = []

    @declop.reconciler("configmaps", registry=registry, field="data.size")
    def size(old: Any, new: Any) -> None:
        calls.append((old, new))

    with runner(registry, kubeconfig, namespace):
        create(core, namespace, {"size": "1"})
        create(core, namespace, {"size": "5"}, name="untouched")
        wait_for(lambda: snapshot(core, namespace, "size") == {"data": {"size": "1"}}, 20)
        wait_for(lambda: snapshot(core, namespace, "size", name="untouched") == {"data": {"size": "5"}}, 20)
    for n in ("2", "3", "4"):  # three edits while nobody watches
        edit(core, namespace, {"data": {"size": n}})
    with runner(registry, kubeconfig, namespace):
        wait_for(lambda: snapshot(core, namespace, "size") == {"data": {"size": "4"}}, 20, what="the change handled")
        edit(core, namespace, {"data": {"size": "6"}}, name="untouched")  # a later change: the first list is done
        wait_for(lambda: snapshot(core, namespace, "size", name="untouched") == {"data": {"size": "6"}}, 20)
    assert sorted(calls, key=str) == sorted([(None, "1"), (None, "5"), ("1", "4"), ("5", "6")], key=str)


SIZE_NOTES = """
import json, os

import declop


@declop.reconciler("configmaps", field="data.size")
def size(old, new):
    with open(os.environ["DECLOP_TEST_OUT"], "a") as f:
        f.write(json.dumps({"replica": os.environ["DECLOP_TEST_REPLICA"], "old": old, "new": new}) + "\\n")
"""


def test_after_a_leader_is_killed_the_new_leader_handles_only_what_is_new(control_plane: Any, namespace: str, core: Any, tmp_path: Any) -> None:
    """kill -9 of the leader after it handled a change: the standby takes the Lease, lists every
    object, finds the snapshot on it equal to the state (nothing handled twice) and handles the
    next change with the old value the dead leader handled."""
    from declop.testing import Replicas

    handlers = tmp_path / "sizes.py"
    handlers.write_text(SIZE_NOTES)
    out = tmp_path / "notes.jsonl"
    args = [
        str(handlers), "-n", namespace, "--leader-elect", "--leader-election-id", "sizes",
        "--leader-election-namespace", namespace, "--lease-duration", "3", "--renew-deadline", "2",
        "--retry-period", "0.3",
    ]  # fmt: skip

    def notes() -> list[tuple[str, Any, Any]]:
        lines = out.read_text().splitlines() if out.exists() else []
        return [(n["replica"], n["old"], n["new"]) for n in map(json.loads, lines)]

    with Replicas(args, env=control_plane.env()) as replicas:
        for r in "ab":
            replicas.start(r, DECLOP_TEST_REPLICA=r, DECLOP_TEST_OUT=str(out))
        create(core, namespace, {"size": "1"})
        wait_for(lambda: snapshot(core, namespace, "size") == {"data": {"size": "1"}}, 60, what="the first change handled")
        ((leader, _, _),) = notes()
        assert replicas.kill(leader) == -9
        edit(core, namespace, {"data": {"size": "2"}})
        wait_for(lambda: snapshot(core, namespace, "size") == {"data": {"size": "2"}}, 60, what="the standby handling the next")
        other = "b" if leader == "a" else "a"
    assert notes() == [(leader, None, "1"), (other, "1", "2")]
