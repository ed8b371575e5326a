"""declop.cache.informer.InformerPool: sharing, and reads from handler threads while the loop adds."""

from __future__ import annotations

import threading

from declop.kube.discovery import ResourceInfo
from declop.cache.informer import InformerPool


def resource(plural: str, group: str = "example.com") -> ResourceInfo:
    return ResourceInfo(group=group, version="v1", plural=plural, kind=plural.title(), namespaced=True)


def test_existing_lists_unfiltered_informers_of_the_resource_only() -> None:
    pool = InformerPool(transport=None, namespaces=("a", "b"))  # type: ignore[arg-type]
    widgets, gadgets = resource("widgets"), resource("gadgets")
    assert pool.existing(widgets) == []
    informers = pool.for_resource(widgets)
    pool.get(widgets, "a", label_selector="x=y")
    pool.for_resource(gadgets)
    assert pool.existing(widgets) == informers and [i.namespace for i in informers] == ["a", "b"]
    assert pool.get(widgets, "a") is informers[0]  # shared, not re-created
    assert pool.existing(widgets) == informers


def test_existing_is_safe_from_another_thread_while_informers_are_added() -> None:
    pool = InformerPool(transport=None)  # type: ignore[arg-type]
    target = resource("widgets")
    pool.get(target)
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        try:
            while not stop.is_set():
                assert len(pool.existing(target)) == 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for i in range(3000):  # the loop's side: new resources keep arriving
            pool.get(resource(f"r{i}"))
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == []
