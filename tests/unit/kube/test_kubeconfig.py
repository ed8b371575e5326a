"""declop.kube.kubeconfig: the loading order, merging, every malformed input as one line, exec plugins
(off the loop, refreshed before expiry), certificates loaded without files."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from declop.errors import ApiError, ConfigError
from declop.kube.credentials import Credential, ExecPlugin
from declop.kube.kubeconfig import KubeconfigError, RestConfig, load, load_cert_chain
from declop.testing.cluster.certs import generate


def kubeconfig(path: Path, *, server: str = "https://a.example:6443", cluster: dict[str, Any] | None = None,
               user: dict[str, Any] | None = None, name: str = "a", current: str | None = "a") -> Path:
    doc: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, **(cluster or {})}}],
        "users": [{"name": name, "user": user or {"token": f"token-{name}"}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
    }
    if current:
        doc["current-context"] = current
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "home"
    (h / ".kube").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(h))
    return h


@pytest.fixture
def service_account(tmp_path: Path) -> Path:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("in-cluster-token\n")
    certs = generate(tmp_path / "pki")
    (sa / "ca.crt").write_bytes(Path(certs.serving_ca.cert).read_bytes())
    return sa


IN_CLUSTER = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# -- the loading order (controller-runtime's GetConfig) -----------------------------------------
def test_explicit_kubeconfig_wins_over_everything(tmp_path: Path, home: Path, service_account: Path) -> None:
    explicit = kubeconfig(tmp_path / "explicit", server="https://explicit:1")
    env = {"KUBECONFIG": str(kubeconfig(tmp_path / "env", server="https://env:1")), **IN_CLUSTER}
    cfg = load(str(explicit), environ=env, service_account_dir=str(service_account))
    assert cfg.host == "https://explicit:1" and not cfg.in_cluster


def test_kubeconfig_variable_wins_over_in_cluster(tmp_path: Path, home: Path, service_account: Path) -> None:
    env = {"KUBECONFIG": str(kubeconfig(tmp_path / "env", server="https://env:1")), **IN_CLUSTER}
    assert load(environ=env, service_account_dir=str(service_account)).host == "https://env:1"


def test_in_cluster_wins_over_home(tmp_path: Path, home: Path, service_account: Path) -> None:
    kubeconfig(home / ".kube" / "config", server="https://home:1")
    cfg = load(environ=IN_CLUSTER, service_account_dir=str(service_account))
    assert (cfg.host, cfg.in_cluster, cfg.token_file) == ("https://10.0.0.1:443", True, str(service_account / "token"))
    assert run(cfg.headers()) == {"Authorization": "Bearer in-cluster-token"}


def test_home_last(home: Path) -> None:
    kubeconfig(home / ".kube" / "config", server="https://home:1")
    assert load(environ={}).host == "https://home:1"


def test_nothing_at_all(home: Path) -> None:
    with pytest.raises(ConfigError, match=r"no kubeconfig at .*\.kube/config; pass --kubeconfig, set KUBECONFIG"):
        load(environ={})


def test_kubeconfig_list_is_merged_first_wins_and_missing_files_skipped(tmp_path: Path, home: Path) -> None:
    first = kubeconfig(tmp_path / "first", server="https://first:1", name="shared", current=None)
    second = kubeconfig(tmp_path / "second", server="https://second:1", name="shared", current="shared")
    env = {"KUBECONFIG": os.pathsep.join([str(tmp_path / "missing"), str(first), str(second)])}
    cfg = load(environ=env)
    assert cfg.host == "https://first:1"  # the cluster entry of the first file to define it
    assert cfg.token == "token-shared"


# -- malformed input: one line naming the file and the problem, exit code 2 ----------------------
@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("clusters: [\n  - name: x\n", "is not valid YAML at line 2, column 3: expected the node content, but found '-'"),
        ("- a\n- b\n", "holds a YAML list, not a mapping with clusters, contexts and users"),
        ("just text\n", "holds a YAML string"),
        ("clusters: {a: 1}\n", "clusters must be a list of entries with a name"),
        ("apiVersion: v1\n", "has no current-context; pass --context"),
    ],
)
def test_malformed_kubeconfig(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "config"
    path.write_text(content)
    with pytest.raises(KubeconfigError) as info:
        load(str(path), environ={})
    message = str(info.value)
    assert "\n" not in message and str(path) in message and problem in message, message
    assert info.value.exit_code == 2


def test_a_json_kubeconfig_is_read_without_pyyaml_and_a_yaml_one_the_same(tmp_path: Path) -> None:
    """PyYAML's import is 30-50 ms of a start: a JSON kubeconfig (the test kit's, many
    generators') does without it; the same document in block YAML reads the same."""
    path = kubeconfig(tmp_path / "config.json", cluster={"certificate-authority-data": ""}, user={"token": "t-1"})
    code = (
        "import sys\n"
        "from declop.kube.kubeconfig import load\n"
        f"cfg = load({str(path)!r}, environ={{}})\n"
        "assert cfg.host == 'https://a.example:6443' and cfg.token == 't-1', cfg\n"
        "assert 'yaml' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    import yaml  # type: ignore[import-untyped]

    as_yaml = tmp_path / "config.yaml"
    as_yaml.write_text(yaml.safe_dump(json.loads(path.read_text()), default_flow_style=False))
    assert not as_yaml.read_text().lstrip().startswith("{")
    a, b = load(str(as_yaml), environ={}), load(str(path), environ={})
    assert (a.host, a.token, a.ca_data, a.insecure) == (b.host, b.token, b.ca_data, b.insecure)


def test_a_directory(tmp_path: Path) -> None:
    with pytest.raises(KubeconfigError, match=f"kubeconfig {tmp_path} is a directory, not a file"):
        load(str(tmp_path), environ={})


@pytest.mark.parametrize(
    ("kw", "problem"),
    [
        ({"server": "a.example:6443"}, "needs a server like https://host:6443"),
        ({"cluster": {"proxy-url": "socks5://p:1080"}}, "is not supported; declop tunnels through http:// and https:// proxies"),
        ({"cluster": {"insecure-skip-tls-verify": True, "certificate-authority-data": "eA=="}}, "sets both insecure-skip-tls-verify and a certificate authority"),
        ({"cluster": {"certificate-authority-data": "%%%"}}, "certificate-authority-data is not valid base64"),
        ({"cluster": {"certificate-authority": "nope.crt"}}, "cannot read certificate-authority"),
        ({"user": {"auth-provider": {"name": "gcp"}}}, "uses auth-provider 'gcp', which client-go removed"),
        ({"user": {"exec": {"args": []}}}, "exec needs a command"),
        ({"user": {"client-certificate-data": "eA=="}}, "a client certificate without a key"),
    ],
)
def test_unusable_entries(tmp_path: Path, kw: dict[str, Any], problem: str) -> None:
    path = kubeconfig(tmp_path / "config", **kw)
    with pytest.raises(KubeconfigError) as info:
        load(str(path), environ={})
    assert problem in str(info.value) and "\n" not in str(info.value), info.value


def test_unknown_context(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path / "config")
    with pytest.raises(KubeconfigError, match=r"has no context 'b' \(contexts: a\)"):
        load(str(path), "b", environ={})


# -- what is honoured ----------------------------------------------------------------------------
def test_tls_server_name_proxy_and_relative_files(tmp_path: Path) -> None:
    certs = generate(tmp_path / "pki")
    (tmp_path / "ca.crt").write_bytes(Path(certs.serving_ca.cert).read_bytes())
    (tmp_path / "token").write_text("from-file\n")
    path = kubeconfig(
        tmp_path / "config",
        cluster={"certificate-authority": "ca.crt", "tls-server-name": "kubernetes", "proxy-url": "http://proxy:3128"},
        user={"tokenFile": "token"},
    )
    cfg = load(str(path), environ={})
    assert (cfg.server_name, cfg.proxy) == ("kubernetes", "http://proxy:3128")
    assert cfg.ca_data == Path(certs.serving_ca.cert).read_bytes()
    assert run(cfg.headers()) == {"Authorization": "Bearer from-file"}


@pytest.mark.parametrize(
    ("env", "proxy"),
    [
        ({}, None),
        ({"HTTPS_PROXY": "http://corp:3128"}, "http://corp:3128"),
        ({"https_proxy": "http://corp:3128", "NO_PROXY": ".example,10.0.0.0/8"}, None),
        ({"HTTPS_PROXY": "http://corp:3128", "NO_PROXY": "other.org"}, "http://corp:3128"),
        ({"HTTP_PROXY": "http://plain:3128"}, None),  # an https server uses HTTPS_PROXY only
    ],
)
def test_proxy_from_the_environment_like_go(tmp_path: Path, env: dict[str, str], proxy: str | None) -> None:
    assert load(str(kubeconfig(tmp_path / "c")), environ=env).proxy == proxy
    for loopback in ("https://127.0.0.1:6443", "https://localhost:6443", "https://[::1]:6443"):
        assert load(str(kubeconfig(tmp_path / "l", server=loopback)), environ=env).proxy is None
    explicit = kubeconfig(tmp_path / "d", cluster={"proxy-url": "http://mine:1"})
    assert load(str(explicit), environ=env).proxy == "http://mine:1"  # proxy-url wins


def test_an_in_cluster_service_ip_inside_a_no_proxy_cidr_is_not_proxied(tmp_path: Path, service_account: Path) -> None:
    env = {**IN_CLUSTER, "HTTPS_PROXY": "http://corp:3128", "NO_PROXY": "10.0.0.0/8,.svc"}
    assert load(in_cluster=True, service_account_dir=str(service_account), environ=env).proxy is None
    env["NO_PROXY"] = "192.168.0.0/16"
    assert load(in_cluster=True, service_account_dir=str(service_account), environ=env).proxy == "http://corp:3128"


def test_reprs_never_show_credentials(tmp_path: Path) -> None:
    """A repr lands in tracebacks, debuggers and log lines."""
    certs = generate(tmp_path / "pki")
    key = Path(certs.admin.key).read_bytes()
    cfg = RestConfig(
        host="https://a:6443", token="tok-s3cret", password="pw-s3cret", username="u",
        proxy="http://p:proxy-s3cret@proxy:3128", cert_data=Path(certs.admin.cert).read_bytes(), key_data=key,
        exec_plugin=ExecPlugin("get-token", env=(("API_KEY", "env-s3cret"),)),
    )
    text = repr(cfg)
    for secret in ("tok-s3cret", "pw-s3cret", "proxy-s3cret", "env-s3cret", key.decode()[40:80]):
        assert secret not in text, text
    assert "http://p:xxxxx@proxy:3128" in text and "host='https://a:6443'" in text and "'API_KEY'" in text
    assert "s3cret" not in repr(Credential(token="cred-s3cret", cert=b"c", key=b"key-s3cret"))


def test_insecure_skip_tls_verify(tmp_path: Path) -> None:
    cfg = load(str(kubeconfig(tmp_path / "c", cluster={"insecure-skip-tls-verify": True})), environ={})
    ctx = run(cfg.ssl_context())
    assert ctx.verify_mode == ssl.CERT_NONE and not ctx.check_hostname


def test_basic_auth(tmp_path: Path) -> None:
    cfg = load(str(kubeconfig(tmp_path / "c", user={"username": "u", "password": "p"})), environ={})
    assert run(cfg.headers()) == {"Authorization": "Basic " + base64.b64encode(b"u:p").decode()}


def test_client_certificates_load_without_any_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    certs = generate(tmp_path / "pki")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    ctx = ssl.create_default_context()
    load_cert_chain(ctx, Path(certs.admin.cert).read_bytes(), Path(certs.admin.key).read_bytes())
    assert list(scratch.iterdir()) == []


def test_a_client_certificate_with_another_key_is_one_line_and_needs_no_trust_store(tmp_path: Path, mocker: Any) -> None:
    certs = generate(tmp_path / "pki")
    b64 = lambda p: base64.b64encode(Path(p).read_bytes()).decode()  # noqa: E731
    good = kubeconfig(tmp_path / "good", user={"client-certificate-data": b64(certs.admin.cert), "client-key-data": b64(certs.admin.key)})
    bad = kubeconfig(tmp_path / "bad", user={"client-certificate-data": b64(certs.admin.cert), "client-key-data": b64(certs.serving_ca.key)})
    # checking that the pair loads parses no system trust store (~40 ms of every start)
    roots = mocker.spy(ssl.SSLContext, "load_default_certs")
    assert load(str(good), environ={}).cert_data
    assert roots.call_count == 0
    with pytest.raises(KubeconfigError) as info:
        load(str(bad), environ={})
    assert "user 'a': the client certificate and key do not load" in str(info.value) and "\n" not in str(info.value)


def test_401_messages_fit_where_credentials_came_from(tmp_path: Path, service_account: Path) -> None:
    mine = load(str(kubeconfig(tmp_path / "c", name="alice", current="alice")), environ={})
    assert "rejected the token of user 'alice' in kubeconfig" in mine.explain_401()
    pod = load(environ=IN_CLUSTER, service_account_dir=str(service_account))
    assert "rejected the service account token (401)" in pod.explain_401()


# -- exec plugins --------------------------------------------------------------------------------
PLUGIN = """\
import json, os, sys, time, datetime
started = time.time()
count = os.environ["COUNT_FILE"]
with open(count, "a") as f:
    f.write("x")
n = len(open(count).read())
time.sleep(float(os.environ.get("PLUGIN_SLEEP", "0")))
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
assert info["kind"] == "ExecCredential" and info["spec"]["interactive"] is False
status = {"token": f"token-{n}"}
ttl = float(os.environ.get("PLUGIN_TTL", "0"))
if ttl:
    at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=ttl)
    status["expirationTimestamp"] = at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    with open(count + ".runs", "a") as f:  # when each run began, and when its token expires
        f.write(f"{started} {at.timestamp()}\\n")
print(json.dumps({"apiVersion": info["apiVersion"], "kind": "ExecCredential", "status": status}))
"""


def exec_config(tmp_path: Path, **env: str) -> RestConfig:
    plugin = tmp_path / "plugin.py"
    plugin.write_text(PLUGIN)
    env = {"COUNT_FILE": str(tmp_path / "count"), **env}
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable,
                     "args": [str(plugin)], "env": [{"name": k, "value": v} for k, v in env.items()]}}
    return load(str(kubeconfig(tmp_path / "config", user=user)), environ={})


def test_exec_plugin_runs_off_the_event_loop(tmp_path: Path) -> None:
    cfg = exec_config(tmp_path, PLUGIN_SLEEP="1.0")

    async def main() -> float:
        gaps, last = [], time.monotonic()
        task = asyncio.ensure_future(cfg.headers())
        while not task.done():
            await asyncio.sleep(0.02)
            now = time.monotonic()
            gaps.append(now - last)
            last = now
        assert task.result() == {"Authorization": "Bearer token-1"}
        return max(gaps)

    worst = run(main())
    print(f"measured: longest loop stall during a 1 s plugin run {worst * 1000:.0f} ms")
    assert worst < 0.3


def test_exec_credential_is_cached_then_refreshed_before_it_expires(tmp_path: Path) -> None:
    # 4 s: declop refreshes a fifth of the lifetime early (0.8 s), more than a busy machine takes
    # to start the plugin's interpreter — with 1.5 s (0.3 s early) the refresh ran late under load
    cfg = exec_config(tmp_path, PLUGIN_TTL="4")

    async def main() -> list[str]:
        seen = [(await cfg.headers())["Authorization"]]
        seen.append((await cfg.headers())["Authorization"])  # cached
        deadline = time.monotonic() + 10
        while (await cfg.headers())["Authorization"] == seen[0]:
            assert time.monotonic() < deadline, "the credential was never refreshed"
            await asyncio.sleep(0.02)
        seen.append((await cfg.headers())["Authorization"])
        return seen

    assert run(main()) == ["Bearer token-1", "Bearer token-1", "Bearer token-2"]
    # the plugin's own record (its clock, so a slow plugin start on a busy machine does not count):
    # the second run began before the first token expired
    (start1, expiry1), (start2, _) = [tuple(map(float, line.split())) for line in (tmp_path / "count.runs").read_text().splitlines()]
    assert start2 < expiry1, f"refreshed {start2 - expiry1:.2f} s after the expiry, not before"
    assert start2 - start1 > 0.5, "the first token was used for a while before the refresh"


def test_a_401_drops_the_cached_exec_credential(tmp_path: Path) -> None:
    cfg = exec_config(tmp_path)
    assert run(cfg.headers()) == {"Authorization": "Bearer token-1"}
    assert cfg.unauthorized() is True
    assert run(cfg.headers()) == {"Authorization": "Bearer token-2"}


@pytest.mark.parametrize(
    ("command", "problem"),
    [("/nonexistent/plugin", "command not found; install it"), ("false", "exited with code 1")],
)
def test_exec_plugin_failures_are_one_line(tmp_path: Path, command: str, problem: str) -> None:
    user = {"exec": {"command": command, "installHint": "install it\nfrom somewhere"}}
    cfg = load(str(kubeconfig(tmp_path / "config", user=user)), environ={})
    with pytest.raises(ApiError) as info:
        run(cfg.headers())
    assert problem in str(info.value) and "\n" not in str(info.value)


def test_exec_plugin_client_certificate_is_used_and_replaced(tmp_path: Path) -> None:
    """The plugin hands out a certificate valid for 3 s, a new one each run: the TLS context
    follows it (the transport asks for the context before every request). (0.5 s was shorter
    than a loaded machine takes to start the plugin, so the first certificate came back stale.)"""
    certs = generate(tmp_path / "pki")
    pairs = [certs.admin, certs.issue_client("second")]
    pems = [{"cert": Path(p.cert).read_text(), "key": Path(p.key).read_text()} for p in pairs]
    count = tmp_path / "count"
    script = tmp_path / "certplugin.py"
    script.write_text(textwrap.dedent(f"""\
        import json, datetime
        with open({str(count)!r}, "a") as f:
            f.write("x")
        pem = {pems!r}[len(open({str(count)!r}).read()) % 2]
        at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=3)
        print(json.dumps({{"kind": "ExecCredential", "apiVersion": "client.authentication.k8s.io/v1",
            "status": {{"clientCertificateData": pem["cert"], "clientKeyData": pem["key"],
                       "expirationTimestamp": at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}}}))
        """))
    user = {"exec": {"command": sys.executable, "args": [str(script)]}}
    cfg = load(str(kubeconfig(tmp_path / "config", user=user)), environ={})

    async def main() -> None:
        first = await cfg.ssl_context()
        assert await cfg.ssl_context() is first  # cached: same certificate, same context
        deadline = time.monotonic() + 10
        while await cfg.ssl_context() is first:
            assert time.monotonic() < deadline, "the certificate was never refreshed"
            await asyncio.sleep(0.02)
        assert await cfg.headers() == {}  # no token: the certificate authenticates

    run(main())
    assert count.read_text() == "xx"
