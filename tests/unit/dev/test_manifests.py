"""declop.dev.manifests: reading -f files, the apply order, waiting for CRDs; every failure one line.

The apiserver is replaced by a recording stub here (orders, paths, messages); the real
apiserver applies them in tests/integration/test_dev_reload.py.
"""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any, Mapping

import pytest

from declop.kube.discovery import ResourceInfo
from declop.errors import ApiError, ConfigError
from declop.dev.manifests import FIELD_MANAGER, Manifest, apply, read

CRD = """\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: greetings.hello.example.org
spec:
  group: hello.example.org
  names: {kind: Greeting, plural: greetings}
  scope: Namespaced
  versions: [{name: v1, served: true, storage: true}]
"""

GREETING = """\
apiVersion: hello.example.org/v1
kind: Greeting
metadata:
  name: world
spec:
  name: World
"""

GREETINGS = ResourceInfo("hello.example.org", "v1", "greetings", "Greeting", True)
NAMESPACES = ResourceInfo("", "v1", "namespaces", "Namespace", False)
CONFIGMAPS = ResourceInfo("", "v1", "configmaps", "ConfigMap", True)


def write(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return str(path)


class Apiserver:
    """Records requests; CRDs become Established after ``established_after`` GETs."""

    def __init__(self, established_after: int = 1, refuse: str | None = None, names_accepted: bool = True) -> None:
        self.requests: list[tuple[str, str, Mapping[str, Any] | None, Any, str | None]] = []
        self.established_after = established_after
        self.refuse = refuse
        self.names_accepted = names_accepted
        self.gets = 0

    async def request(self, method: str, path: str, *, params: Any = None, body: Any = None, content_type: str | None = None) -> Any:
        self.requests.append((method, path, params, body, content_type))
        if method == "PATCH" and self.refuse and path.endswith(self.refuse):
            raise ApiError(422, "Invalid", 'Greeting.hello.example.org "world" is invalid: spec.name: Invalid value: 5:\nmust be a string')
        if method == "GET":
            self.gets += 1
            conditions = [{"type": "NamesAccepted", "status": "True" if self.names_accepted else "False",
                           "reason": "MultipleNamesNotAllowed" if not self.names_accepted else "NoConflicts",
                           "message": "" if self.names_accepted else '"Greeting" is already in use'}]
            if self.gets >= self.established_after:
                conditions.append({"type": "Established", "status": "True"})
            else:
                conditions.append({"type": "Established", "status": "False", "reason": "Installing", "message": "the initial names have not been accepted"})
            return {"status": {"conditions": conditions}}
        return {}


class Discovery:
    """Serves core resources, and greetings once :attr:`serves_greetings` is set."""

    def __init__(self, apiserver: Apiserver, served_after_refreshes: int = 1) -> None:
        self.apiserver = apiserver
        self.refreshes = 0
        self.served_after = served_after_refreshes

    async def refresh(self) -> None:
        self.refreshes += 1

    def resources(self) -> list[ResourceInfo]:
        extra = [GREETINGS] if self.refreshes >= self.served_after else []
        return [NAMESPACES, CONFIGMAPS, *extra]


def run_apply(manifests: list[Manifest], apiserver: Apiserver, discovery: Discovery | None = None, timeout: float = 5.0) -> list[Manifest]:
    return asyncio.run(apply(manifests, apiserver, discovery or Discovery(apiserver), timeout=timeout))  # type: ignore[arg-type]


# -- read ---------------------------------------------------------------------------------------


def test_read_a_multi_document_file_and_a_folder_in_order(tmp_path: Path) -> None:
    crd = write(tmp_path / "crd.yaml", CRD + "---\n" + GREETING + "---\n")
    folder = tmp_path / "more"
    write(folder / "b.yml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: b, namespace: demo}\n")
    write(folder / "a.json", '{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo"}}')
    write(folder / "notes.txt", "not a manifest")
    got = read([crd, str(folder)])
    assert [str(m) for m in got] == [
        f"{crd}: CustomResourceDefinition greetings.hello.example.org",
        f"{crd}: Greeting world",
        f"{folder / 'a.json'}: Namespace demo",
        f"{folder / 'b.yml'}: ConfigMap demo/b",
    ]
    assert got[0].is_crd and not got[1].is_crd


def test_a_list_is_expanded(tmp_path: Path) -> None:
    path = write(tmp_path / "list.yaml", "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: ConfigMap, metadata: {name: a}}\n- {apiVersion: v1, kind: ConfigMap, metadata: {name: b}}\n")
    assert [m.name for m in read([path])] == ["a", "b"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: ConfigMap\nmetadata: {name: x}\n", r"bad.yaml, document 1: the object has no apiVersion; every manifest needs"),
        ("apiVersion: v1\nkind: ConfigMap\n", r"bad.yaml, document 1: the object has no metadata.name"),
        ("apiVersion: v1\n---\n- a\n- b\n", r"bad.yaml, document 1: the object has no kind, metadata.name"),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n- a\n", r"bad.yaml, document 2: expected a Kubernetes object \(a mapping\), got list"),
        ("apiVersion: v1\nkind: [unclosed\n", r"bad.yaml:3: not valid YAML: "),
    ],
)
def test_malformed_files_are_one_line_naming_file_and_document(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path / "bad.yaml", text)
    with pytest.raises(ConfigError, match=message) as exc:
        read([path])
    assert "\n" not in str(exc.value)


def test_missing_path_and_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no such file: .*nope.yaml; -f takes a YAML file or a folder"):
        read([str(tmp_path / "nope.yaml")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"no .yaml, .yml or .json files in folder"):
        read([str(tmp_path / "empty")])


# -- apply --------------------------------------------------------------------------------------


def test_crds_first_then_namespaces_then_the_rest_by_server_side_apply(tmp_path: Path) -> None:
    path = write(tmp_path / "all.yaml", GREETING + "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: demo}\n---\n" + CRD)
    apiserver = Apiserver(established_after=3)
    applied = run_apply(read([path]), apiserver)
    assert [m.kind for m in applied] == ["CustomResourceDefinition", "Namespace", "Greeting"]
    patches = [(p, params, ct) for method, p, params, _, ct in apiserver.requests if method == "PATCH"]
    assert [p for p, _, _ in patches] == [
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/greetings.hello.example.org",
        "/api/v1/namespaces/demo",
        "/apis/hello.example.org/v1/namespaces/default/greetings/world",  # no namespace: default
    ]
    assert all(params == {"fieldManager": FIELD_MANAGER, "force": "true"} for _, params, _ in patches)
    assert all(ct == "application/apply-patch+yaml" for _, _, ct in patches)
    # the Greeting was sent only after the CRD reported Established (third GET)
    methods = [m for m, *_ in apiserver.requests]
    assert methods == ["PATCH", "GET", "GET", "GET", "PATCH", "PATCH"]
    greeting_body = apiserver.requests[-1][3]
    assert greeting_body["metadata"] == {"name": "world", "namespace": "default"}


def test_a_refused_object_names_file_kind_and_the_apiservers_message_in_one_line(tmp_path: Path) -> None:
    path = write(tmp_path / "crd.yaml", CRD + "---\n" + GREETING)
    with pytest.raises(ConfigError) as exc:
        run_apply(read([path]), Apiserver(refuse="/greetings/world"))
    assert str(exc.value) == (
        f"{path}: Greeting world: the apiserver refused it: Greeting.hello.example.org \"world\" is invalid: "
        "spec.name: Invalid value: 5:; must be a string"
    )


def test_an_unknown_kind_says_to_add_its_crd(tmp_path: Path) -> None:
    path = write(tmp_path / "greeting.yaml", GREETING)
    with pytest.raises(ConfigError, match=r"greeting.yaml: Greeting world: the apiserver serves no kind Greeting in hello.example.org/v1; .*CustomResourceDefinition to -f"):
        run_apply(read([path]), Apiserver(), Discovery(Apiserver(), served_after_refreshes=99))


def test_a_crd_that_is_never_established_times_out_with_its_conditions(tmp_path: Path) -> None:
    path = write(tmp_path / "crd.yaml", CRD)
    with pytest.raises(ConfigError) as exc:
        run_apply(read([path]), Apiserver(established_after=10**9), timeout=0.2)
    message = str(exc.value)
    assert message.startswith(f"{path}: CustomResourceDefinition greetings.hello.example.org: not Established after 0.2 s (")
    assert "Established=False (the initial names have not been accepted)" in message
    assert message.endswith("check the CRD with kubectl describe crd greetings.hello.example.org")


def test_rejected_names_fail_at_once(tmp_path: Path) -> None:
    path = write(tmp_path / "crd.yaml", CRD)
    apiserver = Apiserver(established_after=10**9, names_accepted=False)
    with pytest.raises(ConfigError, match=r"greetings.hello.example.org: its names were not accepted: \"Greeting\" is already in use"):
        run_apply(read([path]), apiserver, timeout=30)
    assert apiserver.gets == 1


def test_established_but_not_yet_served_waits_for_discovery(tmp_path: Path) -> None:
    path = write(tmp_path / "crd.yaml", CRD + "---\n" + GREETING)
    apiserver = Apiserver()
    discovery = Discovery(apiserver, served_after_refreshes=3)
    run_apply(read([path]), apiserver, discovery)
    assert discovery.refreshes == 3
    with pytest.raises(ConfigError, match=r"Established, but discovery still does not serve greetings.hello.example.org after 0.1 s"):
        run_apply(read([path]), Apiserver(), Discovery(apiserver, served_after_refreshes=10**9), timeout=0.1)


# -- the CRDs of typed models ------------------------------------------------------------------


def test_from_models_gives_a_manifest_per_kind_named_after_the_defining_file_and_wires_a_converter(tmp_path: Path) -> None:
    import sys
    import types

    from pydantic import BaseModel

    from declop.dev.manifests import from_models
    from declop.registry import Registry
    from declop.typed.model import CustomResource

    class Spec(BaseModel):
        size: int = 1

    class Thing(CustomResource, group="example.com", version="v1", kind="Thing"):
        spec: Spec

    class Other(CustomResource, group="example.com", version="v1", kind="Other"):
        spec: Spec

    module = types.ModuleType("things_module")
    module.__file__ = str(tmp_path / "things.py")
    module.Thing = Thing  # type: ignore[attr-defined]
    Thing.__module__ = "things_module"
    registry = Registry()
    registry.reconciler("others.example.com")(lambda **_: None)
    registry.webhook("converter", lambda obj, **_: None, "things.example.com", name="convert.things.example.com")
    sys.modules["things_module"] = module
    try:
        manifests = from_models([module], registry, webhook_url="https://dev.example:9443")
    finally:
        del sys.modules["things_module"]
    assert [(m.kind, m.name) for m in manifests] == [("CustomResourceDefinition", "things.example.com")]
    assert manifests[0].is_crd and manifests[0].file == str(tmp_path / "things.py")
    assert manifests[0].obj["spec"]["conversion"]["webhook"]["clientConfig"] == {"url": "https://dev.example:9443/convert/convert.things.example.com"}
    assert from_models([], registry) == []  # Other is not among the modules, and no registration names the class
