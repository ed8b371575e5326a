"""declop.dev.scaffold: names derived and checked, templates rendered, the folder guarded (no cluster).

The generated project's own tests run on a real control plane in
tests/integration/test_scaffold_project.py."""

from __future__ import annotations

import configparser
import fnmatch
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import declop
from declop.dev import scaffold
from declop.errors import ConfigError
from declop.dev.scaffold import ScaffoldError, create, names_for, plural_of, render

ROOT = Path(__file__).resolve().parents[3]


# -- names ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, plural",
    [
        ("Widget", "widgets"),
        ("Policy", "policies"),
        ("Gateway", "gateways"),
        ("Ingress", "ingresses"),
        ("Box", "boxes"),
        ("Batch", "batches"),
        ("Mesh", "meshes"),
        ("Quiz", "quizes"),  # regular rules only: irregular words take --plural
        ("DatabaseCluster", "databaseclusters"),
        ("S3Bucket", "s3buckets"),
    ],
)
def test_plural_of(kind, plural):
    assert plural_of(kind) == plural


def test_every_name_is_derived_from_kind_group_and_version():
    names = names_for("DatabaseCluster", "db.example.com", "v1alpha1")
    assert (names.kind, names.singular, names.plural, names.list_kind) == (
        "DatabaseCluster", "databasecluster", "databaseclusters", "DatabaseClusterList",
    )
    assert names.crd_name == "databaseclusters.db.example.com"
    assert names.api_version == "db.example.com/v1alpha1"
    assert names.finalizer == "databaseclusters.db.example.com/cleanup"
    assert names.project == "databasecluster-operator"
    assert names.python_name == "databasecluster"


def test_version_defaults_to_v1_and_plural_can_be_given():
    names = names_for("Octopus", "sea.example.com", plural="octopodes")
    assert (names.version, names.plural, names.crd_name) == ("v1", "octopodes", "octopodes.sea.example.com")


@pytest.mark.parametrize("kind", ["Class", "Match", "ConfigMap", "Status", "Declop", "Yaml"])
def test_a_singular_python_or_the_templates_need_gets_an_underscore(kind):
    names = names_for(kind, "example.com", plural=f"my{kind.lower()}s")  # configmaps is a built-in's
    assert names.python_name == names.singular + "_"
    assert names.singular == kind.lower()  # the Kubernetes names stay as they are


@pytest.mark.parametrize(
    "args, words",
    [
        (("widget", "example.com"), "Kind 'widget' is not CamelCase"),
        (("my-widget", "example.com"), "(e.g. MyWidget)"),
        (("Wid get", "example.com"), "Kind 'Wid get'"),
        (("", "example.com"), "Kind ''"),
        (("1Widget", "example.com"), "(e.g. Widget)"),
        (("W" * 64, "example.com"), "at most 63"),
        (("WidgetList", "example.com"), "ends in 'List'"),
        (("Widget", "example"), "group 'example' is not a DNS subdomain with a dot"),
        (("Widget", "Example.com"), "group 'Example.com'"),
        (("Widget", "example..com"), "group 'example..com'"),
        (("Widget", "-example.com"), "group '-example.com'"),
        (("Widget", "apps.k8s.io"), "reserved for Kubernetes' own APIs"),
        (("Widget", "kubernetes.io"), "reserved for Kubernetes' own APIs"),
        (("Widget", "example.com", "1"), "version '1' is not a Kubernetes API version"),
        (("Widget", "example.com", "v0"), "version 'v0'"),
        (("Widget", "example.com", "v1gamma1"), "version 'v1gamma1'"),
        (("Widget", "example.com", "v1beta"), "version 'v1beta'"),
        (("Widget", "example.com", "V1"), "version 'V1'"),
        (("Widget", "example.com", "v1", "Widgets"), "plural 'Widgets' must be lowercase"),
        (("Widget", "example.com", "v1", "wid.gets"), "plural 'wid.gets'"),
        (("Widget", "example.com", "v1", "widget"), "the same as the singular"),
        (("Widget", "a" * 250 + ".com"), "group"),
    ],
)
def test_bad_names_are_refused_in_one_line(args, words):
    with pytest.raises(ScaffoldError) as info:
        names_for(*args)
    message = str(info.value)
    assert words in message
    assert "\n" not in message
    assert isinstance(info.value, ConfigError) and info.value.exit_code == 2


@pytest.mark.parametrize(
    "args, builtin",
    [
        (("CronJob", "example.com"), "cronjobs.batch"),  # the new user's case: kubectl get cronjobs lists batch's
        (("Pod", "example.com"), "pods"),
        (("Deployment", "example.com"), "deployments.apps"),
        (("Widget", "example.com", "v1", "cm"), "configmaps"),  # a short name
        (("Widget", "example.com", "v1", "job"), "jobs.batch"),  # a singular
        (("Widget", "example.com", "v1", "crds"), "customresourcedefinitions.apiextensions.k8s.io"),
    ],
)
def test_a_plural_kubectl_resolves_to_a_built_in_resource_is_refused(args, builtin):
    with pytest.raises(ScaffoldError) as info:
        names_for(*args)
    message = str(info.value)
    plural = args[3] if len(args) > 3 else plural_of(args[0])
    assert message.startswith(f"plural {plural!r} is also a name of the built-in {builtin}: `kubectl get {plural}` would list that")
    assert f"--plural example{plural}" in message and "\n" not in message


def test_a_singular_kubectl_resolves_to_a_built_in_resource_is_a_warning():
    names = names_for("Job", "example.com", plural="tasks")
    assert scaffold.warnings_for(names) == [
        "`kubectl get job` lists the built-in jobs.batch, not your Job: use `kubectl get tasks` or "
        "`kubectl get tasks.example.com` (or give another Kind)"
    ]
    assert scaffold.warnings_for(names_for("Widget", "example.com")) == []


def test_the_built_in_names_are_lowercase_and_unique_per_resource():
    for group_resource, (singular, short) in scaffold.BUILTIN_RESOURCES.items():
        assert group_resource == group_resource.lower() and singular == singular.lower()
        assert scaffold.builtin_named(group_resource.partition(".")[0]) is not None
        assert all(scaffold.builtin_named(s) is not None for s in (singular, *short))
    assert scaffold.builtin_named("widgets") is None


@pytest.mark.parametrize("version", ["v1", "v2", "v10", "v1alpha1", "v2beta3", "v1beta12"])
def test_kubernetes_versions_are_accepted(version):
    assert names_for("Widget", "example.com", version).version == version


def test_a_crd_name_over_253_characters_is_refused():
    group = ".".join(["a" * 62] * 4)  # 251 characters: a valid group, but widgets.<group> is 259
    with pytest.raises(ScaffoldError, match="longer than 253"):
        names_for("Widget", group)


# -- rendering ------------------------------------------------------------------------------


RENDERED_FILES = {
    ".dockerignore", ".gitignore", "Dockerfile", "README.md", "example.yaml", "handlers.py", "pyproject.toml",
    "tests/test_handlers.py", "tests/test_integration.py", "tests/test_sim.py", "values.yaml",
}
EXPECTED_FILES = RENDERED_FILES | {"rbac-values.yaml"}  # create() adds what `declop rbac --values` writes


@pytest.fixture(scope="module")
def files():
    return render(names_for("Policy", "security.example.com", "v1beta1"))


def test_the_project_has_every_file_and_no_placeholder_left(files):
    assert set(files) == RENDERED_FILES  # no crd.yaml: the model in handlers.py is the CRD
    for path, content in files.items():
        assert "${" not in content, path


@pytest.mark.parametrize("path", ["handlers.py", "tests/test_handlers.py", "tests/test_integration.py", "tests/test_sim.py"])
def test_the_python_files_compile(files, path):
    compile(files[path], path, "exec")


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A project written by create(), its handlers loaded into a registry of the test's own."""
    target, _ = create(names_for("Policy", "security.example.com", "v1beta1"), tmp_path_factory.mktemp("policy"))
    return target


@pytest.fixture(scope="module")
def loaded(project):
    import runpy

    from declop import registry as registry_module

    own = registry_module.Registry()
    saved, registry_module.default_registry = registry_module.default_registry, own
    try:
        module = runpy.run_path(str(project / "handlers.py"), run_name="policy_handlers")
    finally:
        registry_module.default_registry = saved
    return module, own


def test_the_crd_is_made_from_the_model_with_the_derived_names(loaded):
    from declop.typed.crd import definitions

    module, _ = loaded
    (crd,) = definitions([module["Policy"]])
    assert crd["metadata"]["name"] == "policies.security.example.com"
    assert crd["spec"]["group"] == "security.example.com"
    assert crd["spec"]["names"] == {"kind": "Policy", "listKind": "PolicyList", "plural": "policies", "singular": "policy"}
    assert crd["spec"]["scope"] == "Namespaced"
    (version,) = crd["spec"]["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1beta1", True, True)
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == ["Message", "Ready", "Age"]
    schema = version["schema"]["openAPIV3Schema"]["properties"]
    spec = schema["spec"]
    assert spec["required"] == ["message"]
    assert (spec["properties"]["message"]["minLength"], spec["properties"]["message"]["maxLength"]) == (1, 1024)
    assert spec["properties"]["key"]["default"] == "message"
    status = schema["status"]["properties"]
    assert status["observedGeneration"]["type"] == "integer"
    assert status["conditions"]["x-kubernetes-list-map-keys"] == ["type"]


def test_declop_crd_prints_the_models_crd(project):
    result = subprocess.run(
        [sys.executable, "-m", "declop", "crd", "handlers.py"], cwd=project, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    (crd,) = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert crd["metadata"]["name"] == "policies.security.example.com"


def test_the_example_is_a_resource_of_the_crd(files):
    example = yaml.safe_load(files["example.yaml"])
    assert (example["apiVersion"], example["kind"]) == ("security.example.com/v1beta1", "Policy")
    assert example["spec"]["message"]


def test_the_handler_takes_the_typed_model_and_registers_it_with_its_finalizer(files, loaded):
    handlers = files["handlers.py"]
    assert "@declop.reconciler(Policy, finalizer=FINALIZER, owns=[\"configmaps\"])" in handlers
    assert "obj: Policy | None" in handlers
    assert 'FINALIZER = "policies.security.example.com/cleanup"' in handlers
    assert "declop.conditions.set(" in handlers and "declop.create_or_update(" in handlers
    _, registry = loaded
    (registration,) = registry.registrations
    assert registration.model.__name__ == "Policy"
    assert registration.finalizer == "policies.security.example.com/cleanup"


def test_the_rbac_values_are_what_declop_rbac_writes(project):
    """create() wrote rbac-values.yaml in process; the command writes the same bytes."""
    out = project.parent / "rbac-from-the-command.yaml"
    result = subprocess.run(
        [sys.executable, "-m", "declop", "rbac", "handlers.py", "--values", str(out)],
        cwd=project, capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert (project / "rbac-values.yaml").read_text() == out.read_text()


def test_the_rbac_values_grant_the_resource_the_configmaps_and_events(project):
    values = yaml.safe_load((project / "rbac-values.yaml").read_text())
    rules = {(r["apiGroups"][0], r["resources"][0]): r["verbs"] for r in values["rbac"]["generated"]}
    assert rules == {
        ("security.example.com", "policies"): ["get", "list", "watch", "patch"],
        ("security.example.com", "policies/status"): ["update", "patch"],
        ("security.example.com", "policies/finalizers"): ["update"],
        ("", "configmaps"): ["get", "list", "watch", "create", "update", "patch", "delete"],
        ("events.k8s.io", "events"): ["create", "patch"],
    }
    assert set(values) == {"rbac"}  # no webhooks


def test_generating_the_rbac_values_leaves_the_callers_registry_alone(tmp_path):
    before = list(declop.registry.default_registry.registrations)
    create(names_for("Widget", "example.com"), tmp_path)
    assert (tmp_path / "rbac-values.yaml").is_file()
    assert declop.registry.default_registry.registrations == before
    assert not [name for name, m in list(sys.modules.items()) if str(getattr(m, "__file__", None) or "").startswith(str(tmp_path))]


def test_a_kind_that_handlers_py_imports_is_refused():
    with pytest.raises(ScaffoldError, match="Kind 'BaseModel' is a name the generated handlers.py imports"):
        names_for("BaseModel", "example.com")


def test_the_values_leave_the_rbac_to_the_generated_file(files):
    values = yaml.safe_load(files["values.yaml"])
    assert values == {"handlers": {"example": False}}
    assert "-f values.yaml -f rbac-values.yaml" in files["values.yaml"]


def test_the_values_use_only_keys_the_chart_knows(files):
    """The chart's schema forbids unknown keys; a generated key the chart lacks would fail install."""
    values = yaml.safe_load(files["values.yaml"])
    chart = yaml.safe_load((ROOT / "charts" / "declop" / "values.yaml").read_text())
    assert set(values) <= set(chart)
    assert set(values["handlers"]) <= set(chart["handlers"])
    assert "rbac" not in values


def test_the_readme_tells_the_next_commands(files):
    readme = files["README.md"]
    assert "declop dev handlers.py " in readme and "crd.yaml" not in readme.replace("-o crd.yaml", "")
    assert "declop crd handlers.py" in readme
    assert "declop rbac handlers.py --values rbac-values.yaml" in readme
    assert "\npytest" in readme
    assert "kubectl apply -f example.yaml" in readme


def test_every_template_ships_in_the_wheel():
    """setup.cfg's package_data globs must cover every template, or an installed declop lacks it."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    globs = [g.strip() for g in config["options.package_data"]["declop"].splitlines() if g.strip()]
    package = Path(declop.__file__).parent
    templates = [p.relative_to(package).as_posix() for p in (package / scaffold.TEMPLATES).rglob("*") if p.is_file()]
    assert templates
    for template in templates:
        assert template.endswith(scaffold.SUFFIX), template
        assert any(fnmatch.fnmatch(template, g) and template.count("/") == g.count("/") for g in globs), template


# -- the folder -----------------------------------------------------------------------------


def test_create_writes_into_a_new_folder(tmp_path):
    target, written = create(names_for("Widget", "example.com"), tmp_path / "new" / "widgets")
    assert target == tmp_path / "new" / "widgets"
    assert {p.relative_to(target).as_posix() for p in written} == EXPECTED_FILES
    assert (target / ".gitignore").read_text().startswith(".declop/")


def test_create_accepts_an_empty_folder(tmp_path):
    create(names_for("Widget", "example.com"), tmp_path)
    assert (tmp_path / "handlers.py").is_file()


def test_create_refuses_a_folder_that_is_not_empty(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(ScaffoldError, match="exists and is not empty; give --dir a new or empty folder"):
        create(names_for("Widget", "example.com"), tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]


def test_create_refuses_a_file(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(ScaffoldError, match="is a file"):
        create(names_for("Widget", "example.com"), tmp_path / "f")


def test_the_default_folder_is_named_after_the_kind(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    target, _ = create(names_for("Widget", "example.com"))
    assert target == Path("widget-operator") and (tmp_path / "widget-operator" / "rbac-values.yaml").is_file()


# -- the command ----------------------------------------------------------------------------


def declop_new(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "declop", "new", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def test_the_command_prints_what_it_wrote_and_what_to_do_next(tmp_path):
    result = declop_new("Widget", "--group", "example.com", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Created widgets.example.com (example.com/v1, Kind Widget) in widget-operator/:\n")
    assert "  handlers.py\n" in result.stdout and "  tests/test_integration.py\n" in result.stdout
    assert "  rbac-values.yaml\n" in result.stdout
    assert result.stdout.endswith("Next:\n  cd widget-operator\n  declop dev handlers.py\n  pytest\n")


@pytest.mark.parametrize(
    "args, words",
    [
        (("widget", "--group", "example.com"), "Kind 'widget' is not CamelCase"),
        (("Widget", "--group", "example"), "group 'example' is not a DNS subdomain"),
        (("Widget", "--group", "example.com", "--version", "1.0"), "version '1.0'"),
        (("Widget", "--group", "example.com", "--plural", "Widgets"), "plural 'Widgets'"),
        (("Widget", "--group", "example.com", "--dir", "."), "exists and is not empty"),
        (("CronJob", "--group", "example.com"), "plural 'cronjobs' is also a name of the built-in cronjobs.batch"),
    ],
)
def test_the_command_refuses_bad_input_in_one_line(tmp_path, args, words):
    (tmp_path / "occupied").write_text("")
    result = declop_new(*args, cwd=tmp_path)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [lines[0]] and lines[0].startswith("declop: error: ") and words in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["occupied"]


def test_the_command_warns_about_a_singular_kubectl_gives_to_a_built_in(tmp_path):
    result = declop_new("Job", "--group", "example.com", "--plural", "tasks", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == (
        "declop: warning: `kubectl get job` lists the built-in jobs.batch, not your Job: use `kubectl get tasks` "
        "or `kubectl get tasks.example.com` (or give another Kind)\n"
    )
    assert (tmp_path / "job-operator" / "handlers.py").exists()


def test_the_dockerfile_builds_the_operator_from_this_declops_image(files):
    from declop.version import __version__

    dockerfile = files["Dockerfile"]
    assert f"ARG DECLOP_IMAGE=declop:{__version__}\nFROM $DECLOP_IMAGE\n" in dockerfile
    assert dockerfile.rstrip().endswith("COPY handlers.py /app/handlers/handlers.py")
    # the build context is a whitelist: kubeconfigs (.declop/) and virtualenvs never reach it
    assert [l for l in files[".dockerignore"].splitlines() if not l.startswith("#")] == ["*", "!handlers.py"]


def test_the_generated_handlers_pass_declop_sim(tmp_path: Path) -> None:
    """A new user's first `declop sim handlers.py`: every seed failed I3 for every object, because
    the workload's objects had an empty spec that the generated model refuses (spec.message is
    required). The workload now gives a typed handler's objects the smallest spec its CRD accepts."""
    project, _ = create(names_for("Widget", "example.com"), tmp_path / "widget-operator")
    result = subprocess.run(
        [sys.executable, "-m", "declop", "sim", "handlers.py", "--seeds", "5"],
        cwd=project, capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 seeds, 0 failed" in result.stdout
    one = subprocess.run(
        [sys.executable, "-m", "declop", "sim", "handlers.py", "--seed", "3"],
        cwd=project, capture_output=True, text=True, timeout=300, check=False,
    )
    writes = int(one.stdout.split("handler writes: ", 1)[1].split(" ", 1)[0])
    assert writes > 100, one.stdout  # its objects pass the model: the handler reconciles and writes
