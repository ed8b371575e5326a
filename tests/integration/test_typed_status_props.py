"""Property-based round trips of typed status writes against the real apiserver (Hypothesis).

Each example generates a status model over the supported field types — str, int, float, bool, an
``Enum``, a ``Literal``, ``datetime`` (aware or naive), ``IntOrString``, ``X | None``, ``list[X]``,
``dict[str, X]``, nested models, aliases, defaults (plain, ``None``, ``default_factory``) — and its
CRD from ``declop crd``'s :func:`~declop.typed.crd.definitions`, which the apiserver must accept as
structural. Then, on one object of that kind:

1. a random status value (with a random subset of its optional fields set) is written with
   :func:`~declop.typed.status.status_ops` against the status that was read; the apiserver must
   admit it, and the stored status, read back through the model, must equal it by the law of
   docs/typed.md (fields left unsaid, and a ``None`` the CRD cannot hold, excepted);
2. writing the same value again must send nothing;
3. random in-place edits of the view of the stored object (set a field, ``None``, append to or
   drop from a list, add or remove a map key, change a field of a sub-model, also one the stored
   status lacked) are written the same way, and the law checked again.

``DECLOP_PROPS_EXAMPLES`` sets the number of examples (6 here, fixed seed; ``make
test-typed-props`` runs 100 with a random one).
"""

from __future__ import annotations

import ast
import asyncio
import enum
import itertools
import os
import re
import string
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from datetime import datetime, timedelta, timezone
from typing import Annotated, Any, Iterator, Literal, Optional, Union

import kubernetes.client
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field, TypeAdapter, create_model

from declop.kube.transport import PATCH_TYPES, Transport, load_configuration
from declop.dev.scaffold import names_for, render
from declop.testing.cluster.runner import wait_for
from declop.typed.crd import definitions
from declop.typed.model import CustomResource, IntOrString
from declop.typed.status import _none_default, _said, encode, status_ops, to_json
from declop.typed.view import view

pytestmark = pytest.mark.integration

GROUP = "props.declop.example.com"
EXAMPLES = int(os.environ.get("DECLOP_PROPS_EXAMPLES", "6"))
_names = itertools.count()

# --------------------------------------------------------------------------- the types

LEAVES = ("str", "int", "float", "bool", "enum", "literal", "datetime", "intorstr")


@dataclass
class Type:
    """One field type: a leaf, or ``opt``/``list``/``dict`` of ``inner``, or a nested ``model``."""

    tag: str
    inner: Type | None = None
    model: ModelSpec | None = None
    enum: Any = None

    def annotation(self) -> Any:
        if self.tag == "str":
            return str
        if self.tag == "int":
            return int
        if self.tag == "float":
            return float
        if self.tag == "bool":
            return bool
        if self.tag == "enum":
            return self.enum
        if self.tag == "literal":
            return Literal["red", "green", "blue"]
        if self.tag == "datetime":
            return datetime
        if self.tag == "intorstr":
            return IntOrString
        assert self.inner is not None or self.model is not None
        if self.tag == "opt":
            return Optional[self.inner.annotation()]  # noqa: UP007 - built at run time  # type: ignore[union-attr]
        if self.tag == "list":
            return list[self.inner.annotation()]  # type: ignore[misc, union-attr]
        if self.tag == "dict":
            return dict[str, self.inner.annotation()]  # type: ignore[misc, union-attr]
        assert self.model is not None
        return self.model.cls

    def values(self) -> st.SearchStrategy[Any]:
        """Python values a field of this type accepts (models as dicts, by alias)."""
        if self.tag == "str":
            return st.text(st.characters(exclude_categories=("Cs",)), max_size=8)
        if self.tag == "int":
            return st.integers(-(2**53), 2**53)
        if self.tag == "float":
            return st.floats(allow_nan=False, allow_infinity=False, width=64)
        if self.tag == "bool":
            return st.booleans()
        if self.tag == "enum":
            return st.sampled_from(list(self.enum))
        if self.tag == "literal":
            return st.sampled_from(["red", "green", "blue"])
        if self.tag == "datetime":
            zones = st.sampled_from([None, timezone.utc, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-7))])
            return st.builds(lambda d, z: d.replace(tzinfo=z), st.datetimes(datetime(1970, 1, 1), datetime(2200, 1, 1)), zones)
        if self.tag == "intorstr":
            return st.one_of(st.integers(-(2**31), 2**31), st.text(string.ascii_letters + "%-", min_size=1, max_size=5))
        assert self.inner is not None or self.model is not None
        if self.tag == "opt":
            return st.one_of(st.none(), self.inner.values())  # type: ignore[union-attr]
        if self.tag == "list":
            return st.lists(self.inner.values(), max_size=3)  # type: ignore[union-attr]
        if self.tag == "dict":
            keys = st.text(string.ascii_lowercase + "/~.-", min_size=1, max_size=4)
            return st.dictionaries(keys, self.inner.values(), max_size=3)  # type: ignore[union-attr]
        assert self.model is not None
        return self.model.values()


@dataclass
class FieldSpec:
    name: str
    type: Type
    default: str  # "required", "value", "none", "factory"
    default_value: Any = None
    alias: str | None = None

    @property
    def key(self) -> str:
        return self.alias or self.name


@dataclass
class ModelSpec:
    fields: list[FieldSpec]
    cls: Any = field(default=None)

    def build(self) -> Any:
        defs: dict[str, Any] = {}
        for f in self.fields:
            kw: dict[str, Any] = {"alias": f.alias} if f.alias else {}
            if f.default == "value":
                kw["default"] = TypeAdapter(f.type.annotation()).validate_python(f.default_value)
            elif f.default == "none":
                kw["default"] = None
            elif f.default == "factory":
                kw["default_factory"] = {"list": list, "dict": dict}.get(f.type.tag) or (f.type.model.cls if f.type.model else list)  # type: ignore[union-attr]
            defs[f.name] = (f.type.annotation(), Field(**kw))
        self.cls = create_model(f"M{next(_names)}", __base__=BaseModel, **defs)
        return self.cls

    def values(self) -> st.SearchStrategy[dict[str, Any]]:
        """A model's JSON-ish value by alias: every required field, any optional one."""
        required = {f.key: f.type.values() for f in self.fields if f.default == "required"}
        optional = {f.key: f.type.values() for f in self.fields if f.default != "required"}
        return st.fixed_dictionaries(required, optional=optional)


def _enum() -> Any:
    return enum.Enum(f"E{next(_names)}", {"A": "a", "B": "b", "C": "c"}, type=str)


@st.composite
def types_(draw: st.DrawFn, depth: int) -> Type:
    choices = list(LEAVES) + (["opt", "list", "dict", "model"] if depth > 0 else [])
    tag = draw(st.sampled_from(choices))
    if tag == "enum":
        return Type(tag, enum=_enum())
    if tag in LEAVES:
        return Type(tag)
    if tag == "model":
        return Type(tag, model=draw(models(depth - 1)))
    inner = draw(types_(depth - 1))
    if tag == "opt" and inner.tag == "opt":
        return inner
    return Type(tag, inner=inner)


@st.composite
def models(draw: st.DrawFn, depth: int = 2) -> ModelSpec:
    specs = []
    for i in range(draw(st.integers(1, 4))):
        t = draw(types_(depth))
        choices = ["required", "value"]
        if t.tag == "opt":
            choices.append("none")
        if t.tag in ("list", "dict") or (t.tag == "model" and all(f.default != "required" for f in t.model.fields)):  # type: ignore[union-attr]
            choices.append("factory")
        default = draw(st.sampled_from(choices))
        value = draw(t.values()) if default == "value" else None
        alias = draw(st.sampled_from([None, f"f-{i}.x"]))
        specs.append(FieldSpec(f"f{i}", t, default, value, alias))
    spec = ModelSpec(specs)
    spec.build()
    return spec


# --------------------------------------------------------------------------- the law


def law(now: Any, back: Any, info: Any = None, said_only: bool = True) -> list[str]:
    """Where ``back`` (read back through the model) differs from ``now`` (what was written), by
    the law of docs/typed.md: unsaid fields and a ``None`` the CRD cannot hold are excepted."""
    if isinstance(now, BaseModel):
        if not isinstance(back, BaseModel):
            return [f"a model, read back as {back!r}"]
        out = []
        for name, fi in type(now).model_fields.items():
            if said_only and not _said(now, name, fi):
                continue
            out += [f"{name}: {p}" for p in law(getattr(now, name), getattr(back, name), fi, said_only)]
        return out
    if now is None and info is not None and not _none_default(info) and _enum_like(info.annotation):
        return []  # (a): no null in an enum; the apiserver prunes it or fills the default
    if isinstance(now, dict) and isinstance(back, dict) and now.keys() == back.keys():
        return [f"[{k}]: {p}" for k in now for p in law(now[k], back[k], None, said_only)]
    if isinstance(now, list) and isinstance(back, list) and len(now) == len(back):
        return [f"[{i}]: {p}" for i, (a, b) in enumerate(zip(now, back)) for p in law(a, b, None, False)]
    return [] if to_json(now) == to_json(back) else [f"{to_json(now)!r} != {to_json(back)!r}"]


def _enum_like(annotation: Any) -> bool:
    args = getattr(annotation, "__args__", ())
    return any(isinstance(a, type) and issubclass(a, enum.Enum) or getattr(a, "__origin__", None) is Literal for a in args)


# --------------------------------------------------------------------------- values and edits


def values_of(tp: Any, metadata: Any = ()) -> st.SearchStrategy[Any]:
    """Values a field annotated ``tp`` accepts (models as dicts by alias), bounds of
    ``metadata`` (``ge``, ``le``, ``min_length``, ``max_length``) respected."""
    bounds = {type(m).__name__: m for m in metadata}
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated:
        return values_of(args[0], [*metadata, *args[1:]])
    if origin in (Union, types.UnionType):
        if set(args) == {int, str}:
            return st.one_of(st.integers(-(2**31), 2**31), st.text(string.ascii_letters + "%-", min_size=1, max_size=5))
        (inner,) = [a for a in args if a is not type(None)]
        return st.one_of(st.none(), values_of(inner, metadata))
    if origin is Literal:
        return st.sampled_from(args)
    if origin is list:
        return st.lists(values_of(args[0]), max_size=3)
    if origin is dict:
        return st.dictionaries(st.text(string.ascii_lowercase + "/~.-", min_size=1, max_size=4), values_of(args[1]), max_size=3)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        fields = tp.model_fields.items()
        required = {i.alias or n: values_of(i.annotation, i.metadata) for n, i in fields if i.is_required()}
        optional = {i.alias or n: values_of(i.annotation, i.metadata) for n, i in fields if not i.is_required()}
        return st.fixed_dictionaries(required, optional=optional)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return st.sampled_from(list(tp))
    if tp is datetime:
        zones = st.sampled_from([None, timezone.utc, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-7))])
        return st.builds(lambda d, z: d.replace(tzinfo=z), st.datetimes(datetime(1970, 1, 1), datetime(2200, 1, 1)), zones)
    if tp is bool:
        return st.booleans()
    if tp is int:
        lo = getattr(bounds.get("Ge"), "ge", -(2**53))
        return st.integers(lo, getattr(bounds.get("Le"), "le", 2**53))
    if tp is float:
        return st.floats(allow_nan=False, allow_infinity=False, width=64)
    if tp is str:
        lo, hi = getattr(bounds.get("MinLen"), "min_length", 0), getattr(bounds.get("MaxLen"), "max_length", 8)
        return st.text(st.characters(exclude_categories=("Cs",)), min_size=lo, max_size=min(hi, 8))
    raise NotImplementedError(f"no values for {tp!r}")


def edit(data: st.DataObject, model: BaseModel, depth: int = 0) -> None:
    """One random in-place change somewhere in ``model``."""
    name = data.draw(st.sampled_from(list(type(model).model_fields)))
    info = type(model).model_fields[name]
    value = getattr(model, name)
    action = data.draw(st.sampled_from(["set", "inner"]))
    if action == "inner" and isinstance(value, BaseModel) and depth < 3:
        edit(data, value, depth + 1)
        return
    if action == "inner" and isinstance(value, list):
        item = _args_of(info.annotation, list)[0]
        if value and data.draw(st.booleans()):
            value.pop(data.draw(st.integers(0, len(value) - 1)))
        else:
            value.append(TypeAdapter(item).validate_python(data.draw(values_of(item))))
        return
    if action == "inner" and isinstance(value, dict):
        item = _args_of(info.annotation, dict)[1]
        if value and data.draw(st.booleans()):
            del value[data.draw(st.sampled_from(sorted(value)))]
        else:
            key = data.draw(st.text(string.ascii_lowercase + "/~", min_size=1, max_size=3))
            value[key] = TypeAdapter(item).validate_python(data.draw(values_of(item)))
        return
    setattr(model, name, TypeAdapter(info.annotation).validate_python(data.draw(values_of(info.annotation, info.metadata))))


def _args_of(tp: Any, origin: type) -> tuple[Any, ...]:
    """The arguments of the ``origin`` (list, dict) inside ``tp`` (through Annotated and Optional)."""
    while typing.get_origin(tp) is not origin:
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    return typing.get_args(tp)


# --------------------------------------------------------------------------- the apiserver


@pytest.fixture(scope="module")
def apis(control_plane: Any) -> Iterator[tuple[Any, Any]]:
    api = control_plane.api_client()
    yield kubernetes.client.ApiextensionsV1Api(api), kubernetes.client.CustomObjectsApi(api)
    api.close()


def cr_class(status: Any) -> type[CustomResource]:
    n = next(_names)
    kind = f"Prop{n}"

    def body(ns: dict[str, Any]) -> None:
        ns["__annotations__"] = {"spec": dict[str, str], "status": Optional[status]}  # noqa: UP007
        ns["spec"] = Field(default_factory=dict)
        ns["status"] = None

    return types.new_class(kind, (CustomResource,), {"group": GROUP, "version": "v1", "kind": kind}, body)


def install(ext: Any, custom: Any, model: type[CustomResource], namespace: str) -> str:
    """Create the CRD and wait until an object of it can be created; the object's name."""
    (crd,) = definitions([model])
    ext.create_custom_resource_definition(crd)  # refused if not structural: the test fails here
    kind = model.kind_of()
    obj = {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": {"name": "p"}}

    def create() -> bool | None:
        try:
            custom.create_namespaced_custom_object(GROUP, "v1", namespace, kind.plural, obj)
            return True
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None  # not served yet
            raise

    wait_for(create, 30, what=f"{kind.plural} served")
    return kind.plural


def write(kubeconfig: str, namespace: str, plural: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
    """Send ``ops`` as the client does: encoded as Go writes JSON (:func:`~declop.typed.status.encode`)."""

    async def send() -> dict[str, Any]:
        transport = Transport(load_configuration(kubeconfig))
        try:
            path = f"/apis/{GROUP}/v1/namespaces/{namespace}/{plural}/p/status"
            return await transport.request("PATCH", path, body=encode(ops), content_type=PATCH_TYPES["json"])  # type: ignore[no-any-return]
        finally:
            await transport.close()

    return asyncio.run(send())


@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize="DECLOP_PROPS_EXAMPLES" not in os.environ,
          suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])  # no shrinking: each try is a CRD
@given(spec=models(), data=st.data())
def test_a_typed_status_round_trips_through_the_apiserver(apis: tuple[Any, Any], kubeconfig: str, namespace: str,
                                                          spec: ModelSpec, data: st.DataObject) -> None:
    round_trips(apis, kubeconfig, namespace, cr_class(spec.cls), data)


def status_model(model: Any) -> Any:
    """The status model of ``model`` (``status: S | None`` or ``status: S``)."""
    tp = model.model_fields["status"].annotation
    return next((a for a in typing.get_args(tp) if a is not type(None)), tp)


def round_trips(apis: tuple[Any, Any], kubeconfig: str, namespace: str, model: Any, data: st.DataObject) -> None:
    """The law, on one object of ``model``'s kind: a random status, the same again, random edits."""
    ext, custom = apis
    cls = status_model(model)
    plural = install(ext, custom, model, namespace)
    try:
        stored = custom.get_namespaced_custom_object(GROUP, "v1", namespace, plural, "p")
        # 1: a random value, over what was read
        s = cls.model_validate(data.draw(values_of(cls), label="status"))
        ops = status_ops(s, stored.get("status"))
        if ops:
            stored = write(kubeconfig, namespace, plural, ops)
        back = view(model, stored).status or cls.model_validate({})
        assert law(s, back) == [], (ops, stored.get("status"))
        # 2: the same again: nothing to send
        assert status_ops(s, stored.get("status")) == []
        # 3: in-place edits of the view of what is stored
        for _ in range(data.draw(st.integers(1, 3), label="rounds")):
            obj = view(model, stored)
            status = obj.status or cls()
            for _ in range(data.draw(st.integers(1, 3), label="edits")):
                edit(data, status)
            ops = status_ops(status, stored.get("status"))
            if ops:
                stored = write(kubeconfig, namespace, plural, ops)
            back = view(model, stored).status or cls.model_validate({})
            assert law(status, back) == [], (ops, stored.get("status"))
            assert status_ops(status, stored.get("status")) == []
    finally:
        ext.delete_custom_resource_definition(f"{plural}.{GROUP}")


class Tricky(BaseModel):
    text: str = ""
    ratio: float = 0.0
    amounts: dict[str, float] = Field(default_factory=dict)


TRICKY = {"text": "<a href='x'>&\u2028\b\x01\x7fé\U0008fc60", "ratio": 1e-7,
          "amounts": {"small": 0.00001, "big": 1.5e21, "third": 1 / 3, "whole": 3.0, "neg": -2.5e-300}}


def test_values_go_writes_in_another_spelling_pass_their_test(apis: tuple[Any, Any], kubeconfig: str, namespace: str) -> None:
    """The apiserver's ``test`` compares scalars by the bytes Go writes: a string with ``<``,
    ``&``, U+2028 or a control character, and a float Go writes as ``0.00001`` or ``1e-7``, must
    be sent as Go writes them, or a write that changes another field of the same object fails."""
    ext, custom = apis
    model = cr_class(Tricky)
    plural = install(ext, custom, model, namespace)
    try:
        s = Tricky.model_validate(TRICKY)
        stored = write(kubeconfig, namespace, plural, status_ops(s, None))
        assert law(s, view(model, stored).status) == []
        for change in ("text", "ratio", "small", "big", "third", "whole", "neg"):  # each guarded by its stored value
            t = view(model, stored).status
            assert t is not None
            if change in ("text", "ratio"):
                setattr(t, change, "changed" if change == "text" else 2.0)
            else:
                t.amounts[change] = 7.0
            ops = status_ops(t, stored["status"])
            assert [o["path"].rsplit("/", 1)[-1] for o in ops if o["op"] == "test"] == [change]
            stored = write(kubeconfig, namespace, plural, ops)
            assert law(t, view(model, stored).status) == []
    finally:
        ext.delete_custom_resource_definition(f"{plural}.{GROUP}")


# --------------------------------------------------------------------------- the docs' own models

ROOT = Path(__file__).resolve().parents[2]


def _classes(source: str, name: str) -> dict[str, Any]:
    """The imports and classes of ``source`` (nothing else runs: no registration)."""
    tree = ast.parse(source)
    tree.body = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom, ast.ClassDef))]
    ns: dict[str, Any] = {"__name__": name}
    exec(compile(tree, name, "exec"), ns)  # noqa: S102 - the project's own docs and examples
    for value in list(ns.values()):
        if isinstance(value, type) and issubclass(value, BaseModel) and value.__module__ == name:
            value.model_rebuild(_types_namespace=ns)  # string annotations resolve in the block's names
    return ns


def _docs_sources() -> Iterator[tuple[str, str]]:
    text = (ROOT / "docs/typed.md").read_text()
    for i, block in enumerate(re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)):
        if "Status(BaseModel)" in block and not block.startswith("# from "):  # an excerpt: its file is below
            yield f"docs/typed.md#{i}", block
    yield "examples/crd/handlers.py", (ROOT / "examples/crd/handlers.py").read_text()
    yield "the scaffold", render(names_for("Memo", "scaffold.example.com"))["handlers.py"]


DOCS_MODELS = [
    (where, cls) for where, source in _docs_sources() for cls in _classes(source, where.replace("/", "_")).values()
    if isinstance(cls, type) and issubclass(cls, CustomResource) and "status" in cls.model_fields and cls.__module__ != CustomResource.__module__
]


def test_the_docs_models_are_all_found() -> None:
    assert {w.split("#")[0] for w, _ in DOCS_MODELS} == {"docs/typed.md", "examples/crd/handlers.py", "the scaffold"}


@pytest.mark.parametrize("where,docs_model", DOCS_MODELS, ids=[f"{w}:{c.__name__}" for w, c in DOCS_MODELS])
@settings(max_examples=max(1, EXAMPLES // 8), deadline=None, database=None, derandomize="DECLOP_PROPS_EXAMPLES" not in os.environ,
          suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
@given(data=st.data())
def test_the_docs_status_models_round_trip(apis: tuple[Any, Any], kubeconfig: str, namespace: str, where: str,
                                           docs_model: Any, data: st.DataObject) -> None:
    """docs/typed.md's, examples/crd's and the scaffold's status models, by the same law (each
    on a kind of its own, with the status model as it is written there)."""
    round_trips(apis, kubeconfig, namespace, cr_class(status_model(docs_model)), data)
