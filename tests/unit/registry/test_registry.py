"""declop.registry: the decorator records frozen Registrations and checks handler signatures."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
import re
from typing import Any

import pytest

import declop.registry as registry_module
from declop.errors import ConfigError, RegistrationError
from declop.reconcile.predicates import generation_changed
from declop.registry import INJECTABLE, Registration, Registry, index, reconciler
from declop.reconcile.registration import CHANGE_NAMES
from declop.kube.resource import Resource


@pytest.fixture
def reg() -> Registry:
    return Registry()


@pytest.fixture
def default(monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    """A fresh stand-in for the global default registry, so tests never touch the real one."""
    fresh = Registry()
    monkeypatch.setattr(registry_module, "default_registry", fresh)
    yield fresh


def only(reg: Registry) -> Registration:
    (r,) = reg.registrations
    return r


# -- the decorator --------------------------------------------------------------------------


def test_decorator_returns_the_function_unchanged(reg: Registry) -> None:
    def handle(request: Any, **_: Any) -> str:
        return f"handled {request}"

    decorated = reconciler("pods", registry=reg)(handle)
    assert decorated is handle
    assert decorated(request="x") == "handled x"


def test_registry_method_returns_the_function_unchanged(reg: Registry) -> None:
    def handle(**_: Any) -> None: ...

    assert reg.reconciler("pods")(handle) is handle


def test_registry_argument_isolates_from_the_default(default: Registry) -> None:
    mine = Registry()

    @reconciler("pods", registry=mine)
    def isolated(**_: Any) -> None: ...

    assert [r.name for r in mine.registrations] == ["isolated"]
    assert len(default) == 0


def test_index_registry_argument_isolates_from_the_default(default: Registry) -> None:
    mine = Registry()
    index("pods", "by-node", lambda o: [], registry=mine)
    assert [i.name for i in mine.indexes] == ["by-node"]
    assert default.indexes == []


def test_without_registry_uses_the_default(default: Registry) -> None:
    @reconciler("pods")
    def global_handler(**_: Any) -> None: ...

    assert [r.name for r in default.registrations] == ["global_handler"]


def test_registration_fields(reg: Registry) -> None:
    def map_fn(o: Any) -> list[str]:
        return []

    @reg.reconciler(
        " widgets.example.com ",
        name="widgets",
        finalizer="example.com/cleanup",
        namespaces="team-a",
        labels={"tier": "db", "app": "web"},
        predicates=[generation_changed],
        owns=["configmaps"],
        watches=[("secrets", map_fn)],
        max_concurrent=4,
    )
    def handle(request: Any, obj: Any, phase: Any) -> None: ...

    r = only(reg)
    assert r == Registration(
        fn=handle,
        name="widgets",
        resource="widgets.example.com",
        finalizer="example.com/cleanup",
        namespaces=("team-a",),
        labels="app=web,tier=db",
        predicates=(generation_changed,),
        owns=(Resource("configmaps"),),
        watches=((Resource("secrets"), map_fn),),
        max_concurrent=4,
        is_async=False,
        wants=frozenset({"request", "obj", "phase"}),
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.name = "other"  # type: ignore[misc]


def test_defaults(reg: Registry) -> None:
    @reg.reconciler("pods")
    def handle(**_: Any) -> None: ...

    r = only(reg)
    assert r.finalizer is None
    assert r.namespaces is None
    assert r.labels == ""
    assert r.predicates == ()
    assert r.max_concurrent == 1


def test_namespaces_sequence_and_label_string(reg: Registry) -> None:
    @reg.reconciler("pods", namespaces=["a", "b"], labels="app==web")
    def handle(**_: Any) -> None: ...

    assert only(reg).namespaces == ("a", "b")
    assert only(reg).labels == "app=web"


def test_name_defaults_to_the_function_name(reg: Registry) -> None:
    @reg.reconciler("pods")
    def my_pod_handler(**_: Any) -> None: ...

    assert only(reg).name == "my_pod_handler"


def test_duplicate_names_raise(reg: Registry) -> None:
    def first(**_: Any) -> None: ...

    def second(**_: Any) -> None: ...

    reg.reconciler("pods", name="same")(first)
    with pytest.raises(RegistrationError, match="'same' is already registered"):
        reg.reconciler("deployments.apps", name="same")(second)
    assert only(reg).fn is first


def test_duplicate_function_names_in_different_scopes_raise(reg: Registry) -> None:
    def make() -> Any:
        def handle(**_: Any) -> None: ...

        return handle

    reg.reconciler("pods")(make())
    with pytest.raises(RegistrationError, match="pass name="):
        reg.reconciler("pods")(make())


def test_reregistering_the_same_function_is_allowed(reg: Registry) -> None:
    """Re-importing a module re-runs the decorator on the same function object."""

    def handle(**_: Any) -> None: ...

    reg.reconciler("pods")(handle)
    reg.reconciler("pods")(handle)
    assert len(reg) == 1


def test_registration_error_is_a_config_and_type_error() -> None:
    assert issubclass(RegistrationError, ConfigError)
    assert issubclass(RegistrationError, TypeError)


# -- signatures -----------------------------------------------------------------------------


def test_unknown_argument_raises_naming_it(reg: Registry) -> None:
    def handle(request: Any, flavour: Any) -> None: ...

    with pytest.raises(
        RegistrationError, match=r"handler 'handle' \(test_registry.py:\d+\) takes an unknown argument 'flavour'"
    ) as info:
        reg.reconciler("pods")(handle)
    message = str(info.value)
    assert "declop passes only client, diff, first_seen, logger, name, namespace, new, obj, old, phase, reconcile_id, request" in message
    assert "rename it, or give it a default if it is your own" in message
    assert "did you mean" not in message  # nothing is close to 'flavour'
    assert "**_" not in message  # **_ would not make declop pass it
    assert "\n" not in message
    assert len(reg) == 0


@pytest.mark.parametrize("var_keyword", [False, True], ids=["plain", "with **_"])
def test_misspelt_argument_is_refused_with_did_you_mean(reg: Registry, var_keyword: bool) -> None:
    """``**_`` never fills a name declop does not have: the call would fail every time."""
    if var_keyword:
        def handle(reqest, **_):  # type: ignore[no-untyped-def]
            ...
    else:
        def handle(reqest):  # type: ignore[no-untyped-def]
            ...

    with pytest.raises(RegistrationError) as info:
        reg.reconciler("pods")(handle)
    message = str(info.value)
    assert "takes an unknown argument 'reqest': did you mean 'request'?" in message
    assert "add **_" not in message
    assert len(reg) == 0


@pytest.mark.parametrize(
    ("param", "meant"),
    [("loger", "logger"), ("reqest", "request"), ("namspace", "namespace"), ("phases", "phase"), ("cleint", "client")],
)
def test_defaulted_argument_close_to_an_injectable_is_a_typo(reg: Registry, param: str, meant: str) -> None:
    handle = _handler_with_default(param)
    with pytest.raises(RegistrationError) as info:
        reg.reconciler("pods")(handle)
    message = str(info.value)
    assert f"takes an unknown argument {param!r}, which would always keep its default: did you mean {meant!r}?" in message
    assert len(reg) == 0


def _handler_with_default(param: str) -> Any:
    namespace: dict[str, Any] = {}
    exec(f"def handle(request, {param}=None, **_):\n    return {param}\n", namespace)  # noqa: S102
    return namespace["handle"]


@pytest.mark.parametrize("param", ["retries", "timeout", "log", "body", "patch", "labels"])
def test_defaulted_argument_not_close_to_an_injectable_is_the_handlers_own(reg: Registry, param: str) -> None:
    """A defaulted parameter is the handler's own (a test seam, a functools.partial binding)
    unless it is a typo of an injectable name; Kopf's names with a default are its own too."""
    reg.reconciler("pods")(_handler_with_default(param))
    assert only(reg).wants is None


def test_unknown_argument_with_default_is_allowed(reg: Registry) -> None:
    def handle(request: Any, retries: int = 3) -> None: ...

    reg.reconciler("pods")(handle)
    assert only(reg).wants == frozenset({"request"})


def test_a_name_bound_by_functools_partial_is_not_a_typo(reg: Registry) -> None:
    def handle(request: Any, names: tuple[str, ...] = ()) -> None: ...

    reg.reconciler("pods", name="bound")(functools.partial(handle, names=("a",)))
    assert only(reg).wants == frozenset({"request"})
    with pytest.raises(RegistrationError, match="did you mean 'name'"):
        reg.reconciler("pods", name="unbound")(handle)


def test_a_partial_needs_a_name(reg: Registry) -> None:
    def handle(**_: Any) -> None: ...

    with pytest.raises(RegistrationError, match=r"cannot name partial objects; pass name='...'"):
        reg.reconciler("pods")(functools.partial(handle))


@pytest.mark.parametrize(
    ("param", "hint"),
    [
        ("body", "declare obj instead"),
        ("spec", "read obj['spec']"),
        ("meta", "read obj['metadata']"),
        ("status", "client.patch_status(request, {'status': {...}})"),
        ("patch", "write changes yourself with client.patch(request, {...})"),
        ("memo", "no per-object memo"),
        ("reason", "declare phase instead"),
        ("event", "never passes watch events"),
        ("retry", "raise declop.TerminalError to stop"),
        ("started", "declop does not count retries"),
        ("runtime", "declop does not count retries"),
        ("param", "functools.partial"),
        ("resource", "@declop.reconciler(...)"),
        ("uid", "obj['metadata']['uid']"),
    ],
)
def test_kopf_arguments_name_the_declop_equivalent(reg: Registry, param: str, hint: str) -> None:
    namespace: dict[str, Any] = {}
    exec(f"def handle({param}, **kwargs):\n    pass\n", namespace)  # noqa: S102
    with pytest.raises(RegistrationError) as info:
        reg.reconciler("pods")(namespace["handle"])
    message = str(info.value)
    assert f"takes {param!r}, which Kopf passes and declop does not: " in message
    assert hint in message
    assert "\n" not in message


@pytest.mark.parametrize("param", ["kwargs", "_"])
def test_a_plain_kwargs_argument_asks_for_the_stars(reg: Registry, param: str) -> None:
    namespace: dict[str, Any] = {}
    exec(f"def handle(request, {param}):\n    pass\n", namespace)  # noqa: S102
    with pytest.raises(RegistrationError, match=rf"takes a plain argument '{param}': did you mean \*\*{param}\?"):
        reg.reconciler("pods")(namespace["handle"])


def test_every_injectable_may_be_declared(reg: Registry) -> None:
    def handle(request, name, namespace, client, logger, reconcile_id, phase, obj, trigger, first_seen):  # type: ignore[no-untyped-def]
        ...

    reg.reconciler("pods")(handle)
    assert only(reg).wants == INJECTABLE - CHANGE_NAMES and only(reg).wants_first_seen
    assert only(reg).fn is handle  # none of old/new/diff: not wrapped (docs/changes.md)

    def changes(request, name, namespace, client, logger, reconcile_id, phase, obj, trigger, old, new, diff):  # type: ignore[no-untyped-def]
        ...

    reg.reconciler("pods")(changes)
    assert reg.registrations[-1].fn.__wrapped__ is changes  # type: ignore[attr-defined]


def test_keyword_only_and_no_arguments(reg: Registry) -> None:
    def kw(*, obj: Any) -> None: ...

    def nothing() -> None: ...

    reg.reconciler("pods", name="kw")(kw)
    reg.reconciler("pods", name="nothing")(nothing)
    wants = {r.name: r.wants for r in reg.registrations}
    assert wants == {"kw": frozenset({"obj"}), "nothing": frozenset()}


def test_var_positional_is_ignored(reg: Registry) -> None:
    def handle(*args: Any, request: Any) -> None: ...

    reg.reconciler("pods")(handle)
    assert only(reg).wants == frozenset({"request"})


def test_var_keyword_handler_wants_none(reg: Registry) -> None:
    def with_kwargs(request: Any, unknown: int = 1, **kwargs: Any) -> None: ...

    def with_underscore(**_: Any) -> None: ...

    reg.reconciler("pods")(with_kwargs)
    reg.reconciler("pods")(with_underscore)
    assert [r.wants for r in reg.registrations] == [None, None]


def test_positional_only_injectable_raises(reg: Registry) -> None:
    def handle(request: Any, /) -> None: ...

    with pytest.raises(RegistrationError, match="'request' must not be positional-only; remove the '/'"):
        reg.reconciler("pods")(handle)


# -- decorator options -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "meant"),
    [
        ("own", "owns"),
        ("finalizers", "finalizer"),
        ("namespace", "namespaces"),
        ("label", "labels"),
        ("predicate", "predicates"),
        ("watch", "watches"),
        ("max_concurent", "max_concurrent"),
        ("registy", "registry"),
    ],
)
def test_misspelt_option_says_did_you_mean(reg: Registry, option: str, meant: str) -> None:
    with pytest.raises(RegistrationError) as info:
        reconciler("pods", registry=reg, **{option: ()})  # type: ignore[arg-type]
    assert str(info.value) == f"@reconciler got an unknown option {option}=: did you mean {meant!r}?"
    assert len(reg) == 0


def test_misspelt_option_on_the_registry_method(reg: Registry) -> None:
    with pytest.raises(RegistrationError, match=r"unknown option own=: did you mean 'owns'\?"):
        reg.reconciler("pods", own=["configmaps"])  # type: ignore[arg-type]
    # the method has no registry= option: it is the registry
    with pytest.raises(RegistrationError, match=r"unknown option registry=: the options are name, finalizer, .*max_concurrent, priority, rate_limit, timeout, metadata_only, fields, shard_by, permissions, field, old, new, return_to$"):
        reg.reconciler("pods", registry=reg)  # type: ignore[arg-type]


def test_index_misspelt_option(reg: Registry) -> None:
    with pytest.raises(RegistrationError, match=r"@index got an unknown option registy=: did you mean 'registry'\?"):
        index("pods", "by-node", lambda o: [], registy=reg)  # type: ignore[arg-type]
    assert reg.indexes == []


@pytest.mark.parametrize(
    ("option", "hint"),
    [("id", "use name="), ("when", "predicates=[...]"), ("value", "field='spec.x' with new="), ("retries", "TerminalError")],
)
def test_kopf_options_name_the_declop_equivalent(reg: Registry, option: str, hint: str) -> None:
    with pytest.raises(RegistrationError, match=rf"@reconciler got an unknown option {option}=: .*{re.escape(hint)}"):
        reconciler("pods", registry=reg, **{option: "x"})  # type: ignore[arg-type]


def test_an_unknown_option_nothing_is_close_to_lists_them_all(reg: Registry) -> None:
    with pytest.raises(RegistrationError) as info:
        reconciler("pods", registry=reg, colour="blue")  # type: ignore[arg-type]
    assert str(info.value) == (
        "@reconciler got an unknown option colour=: the options are name, finalizer, namespaces, "
        "labels, predicates, owns, watches, max_concurrent, priority, rate_limit, timeout, metadata_only, fields, shard_by, permissions, field, old, new, return_to, registry"
    )


@pytest.mark.parametrize(
    ("parts", "hint"),
    [
        (("zalando.org", "v1", "kopfexamples"),
         "@declop.reconciler('kopfexamples.zalando.org') (or 'kopfexamples.v1.zalando.org' to pin that version)"),
        (("apps/v1", "deployments"), "@declop.reconciler('deployments.apps') (or 'deployments.v1.apps' to pin"),
        (("example.com", "widgets"), "@declop.reconciler('widgets.example.com')"),
        (("", "v1", "pods"), "@declop.reconciler('pods') (or 'pods.v1' to pin"),
    ],
)
def test_kopf_resource_in_parts_names_the_one_string(reg: Registry, parts: tuple[str, ...], hint: str) -> None:
    with pytest.raises(RegistrationError) as info:
        reconciler(*parts, registry=reg)  # type: ignore[arg-type]
    message = str(info.value)
    assert message.startswith(f"@reconciler({', '.join(map(repr, parts))}): declop takes the resource as one string: ")
    assert hint in message
    with pytest.raises(RegistrationError, match="one string"):
        reg.reconciler(*parts)  # type: ignore[arg-type]


def test_an_option_given_by_position_asks_for_keywords(reg: Registry) -> None:
    with pytest.raises(RegistrationError) as info:
        reconciler("pods", "example.com/cleanup", registry=reg)  # type: ignore[arg-type]
    assert str(info.value) == (
        "@reconciler('pods', 'example.com/cleanup'): declop takes one positional argument, the resource "
        "('pods', 'widgets.example.com'); pass options by keyword, e.g. finalizer='my.domain/name'"
    )


def test_async_detection(reg: Registry) -> None:
    async def async_handler(**_: Any) -> None: ...

    def sync_handler(**_: Any) -> None: ...

    reg.reconciler("pods")(async_handler)
    reg.reconciler("pods")(sync_handler)
    flags = {r.name: r.is_async for r in reg.registrations}
    assert flags == {"async_handler": True, "sync_handler": False}


# -- argument validation ------------------------------------------------------------------


@pytest.mark.parametrize(
    "finalizer",
    ["Example.com/x", "example.com/", "/x", "example.com/-x", "has space", "a/b/c", "x" * 254, ""],
)
def test_invalid_finalizer_name(reg: Registry, finalizer: str) -> None:
    with pytest.raises(RegistrationError, match="is not a valid name"):
        reg.reconciler("pods", finalizer=finalizer)


def test_finalizer_name_part_longer_than_63_characters_is_invalid(reg: Registry) -> None:
    """A finalizer is a qualified name: the part after ``/`` has at most 63 characters (the
    apiserver rejects longer ones with 422 on every patch), however short the whole string is."""
    reg.reconciler("pods", finalizer="example.com/" + "a" * 63)  # the longest valid name part
    with pytest.raises(RegistrationError, match="is not a valid name"):
        reg.reconciler("pods", finalizer="example.com/" + "a" * 64)
    with pytest.raises(RegistrationError, match="is not a valid name"):
        reg.reconciler("pods", finalizer="a" * 64)


@pytest.mark.parametrize("finalizer", ["example.com/cleanup", "cleanup", "a.b-c.io/Do_It.now", "x"])
def test_valid_finalizer_names(reg: Registry, finalizer: str) -> None:
    @reg.reconciler("pods", finalizer=finalizer)
    def handle(**_: Any) -> None: ...

    assert only(reg).finalizer == finalizer


@pytest.mark.parametrize("value", [0, -1, 1.5, "2", None])
def test_max_concurrent_must_be_a_positive_int(reg: Registry, value: Any) -> None:
    with pytest.raises(RegistrationError, match="max_concurrent must be a positive int"):
        reg.reconciler("pods", max_concurrent=value)


@pytest.mark.parametrize("resource", ["", "   ", None, 3])
def test_resource_must_be_a_name(reg: Registry, resource: Any) -> None:
    with pytest.raises(RegistrationError, match="resource must be a name"):
        reg.reconciler(resource)


def test_predicates_must_be_callable(reg: Registry) -> None:
    with pytest.raises(RegistrationError, match="is not callable"):
        reg.reconciler("pods", predicates=["nope"])  # type: ignore[list-item]


@pytest.mark.parametrize(
    "watch", [("secrets",), ("secrets", "fn"), (3, lambda o: []), ["secrets", lambda o: []]]
)
def test_watches_must_be_resource_and_function_pairs(reg: Registry, watch: Any) -> None:
    with pytest.raises(RegistrationError, match="watches entries"):
        reg.reconciler("pods", watches=[watch])


def test_invalid_label_selector(reg: Registry) -> None:
    with pytest.raises(ValueError, match="invalid label selector"):
        reg.reconciler("pods", labels="app in (web")


def test_decorating_a_non_callable(reg: Registry) -> None:
    with pytest.raises(RegistrationError, match="decorates a function"):
        reg.reconciler("pods")("not a function")  # type: ignore[arg-type]


# -- freeze -------------------------------------------------------------------------------


def test_registering_after_freeze_raises(reg: Registry) -> None:
    assert not reg.frozen
    reg.freeze()
    assert reg.frozen

    def late(**_: Any) -> None: ...

    with pytest.raises(RegistrationError, match="manager has already started") as info:
        reg.reconciler("pods")(late)
    assert "imported before the manager runs" in str(info.value)
    assert "'late'" in str(info.value)
    assert len(reg) == 0


def test_index_after_freeze_raises(reg: Registry) -> None:
    reg.freeze()
    with pytest.raises(RegistrationError, match="imported before the manager runs"):
        reg.index("pods", "by-node", lambda o: [])
    assert reg.indexes == []


# -- index --------------------------------------------------------------------------------


def test_index_registration(reg: Registry) -> None:
    def by_node(obj: Any) -> list[str | None]:
        return [obj["spec"].get("nodeName")]

    reg.index("pods", "by-node", by_node)
    index("configmaps", "by-owner", by_node, registry=reg)
    assert [(i.resource, i.name, i.fn) for i in reg.indexes] == [
        ("pods", "by-node", by_node),
        ("configmaps", "by-owner", by_node),
    ]
    assert len(reg) == 0  # indexes are not reconcilers


def test_index_function_must_be_callable(reg: Registry) -> None:
    with pytest.raises(RegistrationError, match="expected a function"):
        reg.index("pods", "by-node", "nope")  # type: ignore[arg-type]


def test_registrations_and_indexes_are_copies(reg: Registry) -> None:
    @reg.reconciler("pods")
    def handle(**_: Any) -> None: ...

    reg.registrations.clear()
    reg.indexes.append(None)  # type: ignore[arg-type]
    assert len(reg.registrations) == 1
    assert reg.indexes == []


# -- metadata only, field selectors, transforms, lifecycle hooks ----------------------------------


def test_metadata_only_and_fields_are_recorded_for_the_primary_and_its_sources(reg: Registry) -> None:
    def map_fn(o: Any) -> list[str]:
        return []

    @reg.reconciler(
        "secrets",
        metadata_only=True,
        fields={"type": "Opaque"},
        owns=[Resource("configmaps", metadata_only=True)],
        watches=[(Resource("pods", fields="spec.nodeName==n1"), map_fn)],
    )
    def handle(**_: Any) -> None: ...

    r = only(reg)
    assert (r.metadata_only, r.fields) == (True, "type=Opaque")
    assert r.primary == Resource("secrets", metadata_only=True, fields="type=Opaque")
    assert r.owns == (Resource("configmaps", metadata_only=True),)
    assert r.watches == ((Resource("pods", fields="spec.nodeName=n1"), map_fn),)


def test_a_resource_object_as_the_primary_takes_its_options_unless_overridden(reg: Registry) -> None:
    @reg.reconciler(Resource("secrets", metadata_only=True, fields="type=Opaque"), name="a")
    def a(**_: Any) -> None: ...

    @reg.reconciler(Resource("secrets", metadata_only=True), metadata_only=False, name="b")
    def b(**_: Any) -> None: ...

    first, second = reg.registrations
    assert (first.resource, first.metadata_only, first.fields) == ("secrets", True, "type=Opaque")
    assert (second.metadata_only, second.fields) == (False, "")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"metadata_only": "yes"}, "metadata_only must be True or False, got 'yes'"),
        ({"fields": "spec.nodeName"}, "'spec.nodeName' is not a valid field selector term"),
        ({"fields": 3}, "fields must be a field selector like 'spec.nodeName=node-1' or a dict, got int"),
        ({"owns": [3]}, "owns= entries are resource names like 'secrets'"),
        ({"watches": [(Resource("pods", metadata_only=True), 3)]}, "watches entries are ('resource', map_fn) pairs"),
    ],
)
def test_bad_cache_options_are_refused_at_registration(reg: Registry, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(RegistrationError) as err:
        reg.reconciler("pods", **kwargs)
    assert message in str(err.value)


def test_transform_is_recorded_once_per_resource_and_must_be_a_function(reg: Registry) -> None:
    def keep(obj: Any) -> Any:
        return obj

    reg.transform(" pods ", keep)
    reg.transform("pods", keep)  # the same function again is harmless (a module imported twice)
    assert reg.transforms == {"pods": keep}
    with pytest.raises(RegistrationError, match="a transform of 'pods' is already registered"):
        reg.transform("pods", lambda o: o)
    with pytest.raises(RegistrationError, match="transform of 'secrets': expected a function obj -> obj, got 'x'"):
        reg.transform("secrets", "x")  # type: ignore[arg-type]


def test_module_level_transform_works_as_call_and_decorator() -> None:
    reg = Registry()

    @registry_module.transform("pods", registry=reg)
    def slim(obj: Any) -> Any:
        return obj

    assert registry_module.transform("secrets", slim, registry=reg) is slim
    assert reg.transforms == {"pods": slim, "secrets": slim}


def test_hook_decorators_bare_and_called_return_the_function_and_record_the_hook() -> None:
    reg = Registry()

    @registry_module.on_startup(registry=reg)
    def prepare(client: Any, logger: Any) -> None: ...

    @registry_module.on_shutdown(name="bye", registry=reg)
    async def cleanup(**_: Any) -> None: ...

    @registry_module.background(every_replica=True, registry=reg)
    async def loop(stop: Any) -> None: ...

    assert [(h.kind, h.name, h.fn, h.wants, h.every_replica) for h in reg.hooks] == [
        ("startup", "prepare", prepare, frozenset({"client", "logger"}), False),
        ("shutdown", "bye", cleanup, None, False),
        ("background", "loop", loop, frozenset({"stop"}), True),
    ]
    assert callable(prepare) and prepare.__name__ == "prepare"


@pytest.mark.parametrize(
    ("register", "message"),
    [
        (lambda r: registry_module.on_startup(42, registry=r), "@declop.on_startup decorates a function, got 42"),
        (lambda r: registry_module.on_shutdown("x", registry=r), "@declop.on_shutdown decorates a function, got 'x'"),
        (
            lambda r: registry_module.background(lambda stop: None, registry=r),
            "must be an 'async def' function: a thread cannot be cancelled",
        ),
        (
            lambda r: registry_module.on_startup(registry=r)(lambda request: None),
            "takes an unknown argument 'request'; declop passes only client, logger, stop",
        ),
        (
            lambda r: registry_module.background(every_replica="yes", registry=r),
            "every_replica must be True or False, got 'yes'",
        ),
    ],
)
def test_bad_hooks_are_refused_at_registration(register: Any, message: str) -> None:
    with pytest.raises(RegistrationError) as err:
        register(Registry())
    assert message in str(err.value)


def test_hooks_cannot_be_registered_after_the_freeze(reg: Registry) -> None:
    reg.freeze()
    with pytest.raises(RegistrationError, match="the manager has already started"):
        registry_module.on_startup(lambda: None, registry=reg)
    with pytest.raises(RegistrationError, match="the manager has already started"):
        reg.transform("pods", lambda o: o)

def test_clear_forgets_everything_and_reopens_a_frozen_registry() -> None:
    reg = Registry()

    @reg.reconciler("pods")
    def first(**_: object) -> None:
        return None

    reg.index("pods", "by-node", lambda obj: [])
    reg.freeze()
    with pytest.raises(RegistrationError, match="already started"):
        reg.reconciler("pods")(first)
    reg.clear()
    assert not reg.frozen and len(reg) == 0 and reg.indexes == []

    @reg.reconciler("configmaps")
    def second(**_: object) -> None:
        return None

    assert [r.name for r in reg.registrations] == ["second"]


# -- tuning options ----------------------------------------------------------------------------
def test_tuning_defaults_and_values(reg: Registry) -> None:
    import declop

    reg.reconciler("pods")(lambda **_: None)
    r = only(reg)
    assert r.priority == declop.queue.priority.Priority(listed=-100, unchanged=-100, aging=10.0)
    assert (r.rate_limit, r.timeout) == (None, None)
    limit = declop.queue.ratelimit.RateLimit(base=0.1, cap=60, qps=50, burst=200)
    reg2 = Registry()
    reg2.reconciler("pods", priority=False, rate_limit=limit, timeout=30)(lambda **_: None)
    r2 = reg2.registrations[0]
    assert (r2.priority, r2.rate_limit, r2.timeout) == (None, limit, 30.0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"priority": "high"}, "priority must be True (the default: a priority queue), False (a FIFO queue) or declop.queue.priority.Priority"),
        ({"priority": 1}, "priority must be True"),
        ({"rate_limit": {"qps": 5}}, "rate_limit must be declop.queue.ratelimit.RateLimit(base=, cap=, qps=, burst=) or None"),
        ({"timeout": 0}, "timeout must be a number of seconds > 0, or None for no timeout, got 0"),
        ({"timeout": -1.5}, "timeout must be a number of seconds > 0"),
        ({"timeout": "30"}, "timeout must be a number of seconds > 0"),
        ({"timeout": float("inf")}, "timeout must be a number of seconds > 0"),
        ({"timeout": True}, "timeout must be a number of seconds > 0"),
    ],
)
def test_bad_tuning_options_fail_at_registration(reg: Registry, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        reg.reconciler("pods", **options)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda d: d.queue.priority.Priority(listed=-1.5), "priority: listed must be an int (higher runs first; NORMAL is 0, LOW is -100), got -1.5"),
        (lambda d: d.queue.priority.Priority(unchanged="low"), "priority: unchanged must be an int"),
        (lambda d: d.queue.priority.Priority(aging=-1), "priority: aging must be a number of priority points per second >= 0 (0: strict priorities), got -1"),
        (lambda d: d.queue.ratelimit.RateLimit(base=-1), "rate_limit: base must be a number of seconds >= 0 (client-go: 0.005), got -1"),
        (lambda d: d.queue.ratelimit.RateLimit(base=2, cap=1), "rate_limit: cap must be a number of seconds >= base (2) (client-go: 1000), got 1"),
        (lambda d: d.queue.ratelimit.RateLimit(qps=0), "rate_limit: qps must be a number > 0, or math.inf for no overall limit (client-go: 10), got 0"),
        (lambda d: d.queue.ratelimit.RateLimit(burst=0), "rate_limit: burst must be an int >= 1 (client-go: 100), got 0"),
        (lambda d: d.queue.ratelimit.RateLimit(burst=1.5), "rate_limit: burst must be an int >= 1"),
    ],
)
def test_bad_priority_and_rate_limit_values_name_the_field(build: Any, message: str) -> None:
    import declop

    with pytest.raises(ConfigError) as info:
        build(declop)
    assert message in str(info.value)


def test_shard_by_defaults_to_uid_and_accepts_namespace(reg: Registry) -> None:
    reg.reconciler("pods", name="a")(lambda **_: None)
    reg.reconciler("configmaps", name="b", shard_by="namespace")(lambda **_: None)
    assert [r.shard_by for r in reg.registrations] == ["uid", "namespace"]


@pytest.mark.parametrize("value", ["name", "", None, "UID"])
def test_shard_by_must_be_uid_or_namespace(reg: Registry, value: Any) -> None:
    with pytest.raises(RegistrationError, match="shard_by must be 'uid' \\(the default\\) or 'namespace'"):
        reg.reconciler("pods", shard_by=value)


# --------------------------------------------------------------------------- typed models

from declop.typed.model import CustomResource  # noqa: E402 - the typed section's own import


class Gadget(CustomResource, group="example.com", version="v1", kind="Gadget"):
    pass


class Sprocket(CustomResource, group="other.io", version="v2", kind="Sprocket"):
    pass


class NoKind(CustomResource):
    pass


def typed_gadget(obj: Gadget, **_: Any) -> None: ...


def typed_sprocket(obj: Sprocket | None, **_: Any) -> None: ...


def untyped_gadget(obj: dict[str, Any], **_: Any) -> None: ...


def test_a_model_goes_wherever_a_resource_name_goes() -> None:
    reg = Registry()
    reg.reconciler(Gadget, owns=[Sprocket], watches=[(Sprocket, lambda o: [])])(typed_gadget)
    r = reg.registrations[0]
    assert r.resource == "gadgets.v1.example.com"
    assert r.owns == (Resource("sprockets.v2.other.io"),)
    assert r.watches[0][0] == Resource("sprockets.v2.other.io")
    reg.index(Gadget, "by-x", lambda o: [])
    reg.transform(Gadget, lambda o: o)
    assert reg.indexes[0].resource == "gadgets.v1.example.com"
    assert list(reg.transforms) == ["gadgets.v1.example.com"]
    assert Resource(Gadget, metadata_only=True).name == "gadgets.v1.example.com"  # type: ignore[arg-type]


def test_webhooks_take_a_model_and_a_converter_serves_the_crd() -> None:
    reg = Registry()
    registry_module.validator(Gadget, registry=reg)(lambda obj: None)
    registry_module.converter(Gadget, registry=reg)(lambda obj, desired_api_version: obj)
    assert [w.resource for w in reg.webhooks] == ["gadgets.v1.example.com", "gadgets.example.com"]


def test_obj_annotated_with_a_model_gets_a_typed_view() -> None:
    reg = Registry()
    reg.reconciler(Gadget)(typed_gadget)
    reg.reconciler("gadgets.example.com", name="by-name")(typed_gadget)
    reg.reconciler(Gadget, name="dict")(untyped_gadget)
    assert [r.model for r in reg.registrations] == [Gadget, Gadget, None]


def test_a_model_without_a_kind_is_one_line() -> None:
    with pytest.raises(RegistrationError, match=r"^NoKind names no kind; give it group=, version= and kind= class keywords$"):
        Registry().reconciler(NoKind)(untyped_gadget)
    with pytest.raises(RegistrationError, match="names no kind"):
        Registry().reconciler("pods", owns=[NoKind])(untyped_gadget)


def test_a_class_that_is_no_model_is_refused() -> None:
    with pytest.raises(RegistrationError, match=r"^resource: dict is a class, not a resource; pass a resource name like 'pods' or a declop.CustomResource subclass$"):
        Registry().reconciler(dict)(untyped_gadget)  # type: ignore[arg-type]
    with pytest.raises(RegistrationError, match="owns=: int is a class"):
        Registry().reconciler("pods", owns=[int])(untyped_gadget)  # type: ignore[list-item]


def test_a_model_of_another_resource_is_refused() -> None:
    with pytest.raises(RegistrationError, match=r"declares obj: Sprocket \(sprockets.v2.other.io\) but reconciles 'gadgets.example.com'"):
        Registry().reconciler("gadgets.example.com")(typed_sprocket)


def test_a_typed_obj_on_a_metadata_only_cache_is_refused() -> None:
    with pytest.raises(RegistrationError, match="its cache holds metadata only"):
        Registry().reconciler(Gadget, metadata_only=True)(typed_gadget)


# -- one spelling of the options -------------------------------------------------------------


def test_every_option_is_a_registration_attribute() -> None:
    """The options are named once (ReconcilerOptions); the Registration the engine reads keeps
    their names, and the canonical form covers each of them."""
    from declop.registry.options import OPTION_NAMES, ReconcilerOptions

    attributes = {f.name for f in dataclasses.fields(Registration)}
    assert set(OPTION_NAMES) <= attributes
    assert set(ReconcilerOptions().settled(Resource("pods"))) == set(OPTION_NAMES) - {"name"}


def test_the_decorators_show_the_options_as_their_signature() -> None:
    """help() and inspect see every option by name and default, though the decorators forward them."""
    import inspect

    from declop.registry import RECONCILER_OPTIONS

    module = inspect.signature(reconciler).parameters
    method = inspect.signature(Registry.reconciler).parameters
    assert list(module)[:2] == ["resource", "parts"] and tuple(module)[2:] == RECONCILER_OPTIONS
    assert tuple(method)[3:] == RECONCILER_OPTIONS[:-1]  # self, resource, parts; no registry=
    assert (module["max_concurrent"].default, module["shard_by"].default, module["priority"].default) == (1, "uid", True)


def test_options_are_checked_when_built() -> None:
    from declop.registry.options import ReconcilerOptions

    with pytest.raises(RegistrationError, match="max_concurrent must be a positive int"):
        ReconcilerOptions(max_concurrent=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ReconcilerOptions().timeout = 1  # type: ignore[misc]


def test_the_same_def_from_a_fresh_execution_of_its_module_replaces_the_old(reg: Registry) -> None:
    """A handler file loaded afresh (declop.loader.load runs it again) registers the same ``def``
    again as a new function object: harmless, and the newest function is kept."""
    source = "def handle(**_):\n    return None\n"
    first: dict[str, Any] = {"__name__": "declop_handlers_h_1"}
    second: dict[str, Any] = {"__name__": "declop_handlers_h_1"}
    exec(compile(source, "/x/h.py", "exec"), first)
    exec(compile(source, "/x/h.py", "exec"), second)
    reg.reconciler("pods")(first["handle"])
    reg.reconciler("pods")(second["handle"])
    assert len(reg) == 1 and reg.registrations[0].fn is second["handle"]
