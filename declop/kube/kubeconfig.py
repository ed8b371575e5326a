"""Kubeconfig: where the apiserver is and who we are, read as kubectl/client-go read it.

:func:`load` picks the source in controller-runtime's order (``config.GetConfig``):

1. ``--kubeconfig PATH`` (that file alone; it must exist);
2. ``$KUBECONFIG`` — a ``os.pathsep`` list, merged as client-go merges it (the first file to set a
   map entry or ``current-context`` wins; missing files are skipped);
3. in-cluster — ``KUBERNETES_SERVICE_HOST``/``_PORT`` and the service-account token and CA;
4. ``~/.kube/config``.

From the chosen cluster and user it honours ``server``, ``certificate-authority(-data)``,
``insecure-skip-tls-verify``, ``tls-server-name``, ``proxy-url`` (``http``/``https``: CONNECT
tunnel; without it ``HTTPS_PROXY``/``NO_PROXY``, as Go's ``ProxyFromEnvironment``), ``client-certificate(-data)``/``client-key(-data)``, ``token``, ``tokenFile``,
``username``/``password`` and ``exec`` credential plugins (run, and kept in memory, by
:mod:`declop.kube.credentials`), into a :class:`~declop.kube.restconfig.RestConfig` that hands
them to the transport. :func:`pod_namespace` reads the namespace of the Pod we run in.

Invariants:
- no credential is ever written to a file: CA bundles are given to ``ssl`` in memory, client
  certificates and keys go through anonymous memory files (``memfd``) that vanish with their
  descriptor — so no exit path (normal, SIGTERM, lease loss, ``os._exit``) can leave one behind;
- a client certificate and key that do not load together, or a CA that does not parse, is
  refused at load, not at the first request;
- every malformed input is one :class:`KubeconfigError` line naming the file and the problem
  (the CLI exits 2).
"""

from __future__ import annotations

import base64
import json
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from declop.errors import ConfigError
from declop.kube.credentials import ExecPlugin as ExecPlugin
from declop.kube.credentials import load_cert_chain as load_cert_chain
from declop.kube.proxy import env_proxy as env_proxy
from declop.kube.proxy import redact_url
from declop.kube.restconfig import RestConfig as RestConfig

__all__ = [
    "ExecPlugin",
    "KubeconfigError",
    "RestConfig",
    "env_proxy",
    "from_kubernetes",
    "load",
    "load_cert_chain",
]

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


class KubeconfigError(ConfigError):
    """The kubeconfig cannot be used: malformed, missing, or naming what is not there. Exit 2."""

    exit_code = 2


# -- loading -------------------------------------------------------------------------------------
def load(
    kubeconfig: str | None = None,
    context: str | None = None,
    *,
    in_cluster: bool | None = None,
    service_account_dir: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> RestConfig:
    """The apiserver and credentials, from the first source in the order of the module docstring.
    ``in_cluster`` forces (True) or forbids (False) the in-cluster source."""
    env = os.environ if environ is None else environ
    if kubeconfig:
        return _from_files([kubeconfig], context, explicit=True, env=env)
    listed = [p for p in (env.get("KUBECONFIG") or "").split(os.pathsep) if p]
    if listed and in_cluster is not True:
        return _from_files(listed, context, explicit=False, env=env)
    if in_cluster or (in_cluster is None and env.get("KUBERNETES_SERVICE_HOST") and env.get("KUBERNETES_SERVICE_PORT")):
        sa_dir = service_account_dir or env.get("DECLOP_SERVICE_ACCOUNT_DIR") or SERVICE_ACCOUNT_DIR
        return _in_cluster(env, sa_dir)
    home = os.path.join(os.path.expanduser("~"), ".kube", "config")
    if os.path.exists(home):
        return _from_files([home], context, explicit=True, env=env)
    raise ConfigError(
        f"no kubeconfig at {home}; pass --kubeconfig, set KUBECONFIG, "
        "or start a local control plane with 'declop dev'"
    )


def _in_cluster(env: Mapping[str, str], sa_dir: str) -> RestConfig:
    host, port = env.get("KUBERNETES_SERVICE_HOST") or "", env.get("KUBERNETES_SERVICE_PORT") or ""
    if not host or not port:
        raise ConfigError("in-cluster configuration needs KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT")
    token = os.path.join(sa_dir, "token")
    ca_file = os.path.join(sa_dir, "ca.crt")
    if not os.path.isfile(token):
        raise ConfigError(
            f"in-cluster configuration failed: no service account token at {token}; "
            "is automountServiceAccountToken off?"
        )
    try:
        with open(ca_file, "rb") as f:
            ca = f.read()
    except OSError as exc:
        raise ConfigError(f"in-cluster configuration failed: cannot read {ca_file}: {exc.strerror}") from exc
    if ":" in host:
        host = f"[{host}]"
    server = f"https://{host}:{port}"
    return RestConfig(
        host=server, source=f"the in-cluster service account token ({token})",
        in_cluster=True, ca_data=ca, token_file=token, proxy=env_proxy(server, env),
    )


def _read(path: str) -> dict[str, Any]:
    if os.path.isdir(path):
        raise KubeconfigError(f"kubeconfig {path} is a directory, not a file")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as exc:
        raise KubeconfigError(f"kubeconfig {path} is not UTF-8 text") from exc
    except OSError as exc:
        raise KubeconfigError(f"cannot read kubeconfig {path}: {exc.strerror}") from exc
    doc = _parse(path, text)
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise KubeconfigError(
            f"kubeconfig {path} holds a YAML {_yaml_kind(doc)}, not a mapping with clusters, contexts and users"
        )
    for section in ("clusters", "contexts", "users"):
        entries = doc.get(section)
        if entries is None:
            continue
        if not isinstance(entries, list) or not all(isinstance(e, dict) and isinstance(e.get("name"), str) for e in entries):
            raise KubeconfigError(f"kubeconfig {path}: {section} must be a list of entries with a name")
    return doc


def _parse(path: str, text: str) -> Any:
    """The document in ``text``. A JSON kubeconfig (what declop's test kit and many generators
    write) is read without PyYAML, whose import alone is a noticeable part of a start; YAML is read
    with libyaml when PyYAML has it (faster), and an error is worded by the pure parser."""
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except ValueError:
            pass  # YAML's flow style is wider than JSON: the YAML parser decides, and words the error
    import yaml  # type: ignore[import-untyped]

    try:
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 (a safe loader)
    except yaml.YAMLError:
        pass
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise KubeconfigError(f"kubeconfig {path} is not valid YAML{where}: {problem}") from exc


def _yaml_kind(doc: Any) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}.get(type(doc), type(doc).__name__)


@dataclass
class _Merged:
    current: str | None = None
    current_file: str | None = None
    entries: dict[str, dict[str, tuple[str, dict[str, Any]]]] = field(
        default_factory=lambda: {"clusters": {}, "contexts": {}, "users": {}}
    )


def _from_files(paths: list[str], context: str | None, *, explicit: bool, env: Mapping[str, str]) -> RestConfig:
    merged = _Merged()
    found = []
    for path in paths:
        if not os.path.exists(path):
            if explicit:
                raise ConfigError(
                    f"no kubeconfig at {path}; pass --kubeconfig, set KUBECONFIG, "
                    "or start a local control plane with 'declop dev'"
                )
            continue  # client-go skips missing files of $KUBECONFIG
        found.append(path)
        doc = _read(path)
        if merged.current is None and doc.get("current-context"):
            merged.current, merged.current_file = str(doc["current-context"]), path
        for section in ("clusters", "contexts", "users"):
            for entry in doc.get(section) or ():
                merged.entries[section].setdefault(entry["name"], (path, entry))
    if not found:
        raise ConfigError(
            f"no kubeconfig at {', '.join(paths)} (KUBECONFIG); pass --kubeconfig, fix KUBECONFIG, "
            "or start a local control plane with 'declop dev'"
        )
    where = found[0] if len(found) == 1 else f"{found[0]} (+{len(found) - 1} merged)"
    name = context or merged.current
    if not name:
        raise KubeconfigError(f"kubeconfig {where} has no current-context; pass --context")
    if name not in merged.entries["contexts"]:
        known = ", ".join(sorted(merged.entries["contexts"])) or "none"
        raise KubeconfigError(f"kubeconfig {where} has no context {name!r} (contexts: {known})")
    ctx_file, ctx_entry = merged.entries["contexts"][name]
    ctx = _section(ctx_entry, "context", ctx_file)
    cluster_name, user_name = ctx.get("cluster"), ctx.get("user")
    if cluster_name not in merged.entries["clusters"]:
        raise KubeconfigError(f"kubeconfig {ctx_file}: context {name!r} names cluster {cluster_name!r}, which is not defined")
    cl_file, cl_entry = merged.entries["clusters"][cluster_name]
    cluster = _section(cl_entry, "cluster", cl_file)
    user: dict[str, Any] = {}
    us_file = ctx_file
    if user_name:
        if user_name not in merged.entries["users"]:
            raise KubeconfigError(f"kubeconfig {ctx_file}: context {name!r} names user {user_name!r}, which is not defined")
        us_file, us_entry = merged.entries["users"][user_name]
        user = _section(us_entry, "user", us_file)
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise KubeconfigError(f"kubeconfig {cl_file}: cluster {cluster_name!r} needs a server like https://host:6443, got {server!r}")
    proxy = cluster.get("proxy-url") or None
    if proxy is not None and not str(proxy).startswith(("http://", "https://")):
        raise KubeconfigError(
            f"kubeconfig {cl_file}: cluster {cluster_name!r}: proxy-url {redact_url(str(proxy))!r} is not supported; "
            "declop tunnels through http:// and https:// proxies (CONNECT), not socks5"
        )
    source = f"user {user_name!r} in kubeconfig {us_file}" if user_name else f"kubeconfig {ctx_file} (no user)"
    cfg = RestConfig(
        host=server.rstrip("/"),
        source=source,
        ca_data=_data(cluster, "certificate-authority", cl_file, f"cluster {cluster_name!r}"),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        server_name=cluster.get("tls-server-name") or None,
        proxy=proxy or env_proxy(server, env),
        cert_data=_data(user, "client-certificate", us_file, f"user {user_name!r}"),
        key_data=_data(user, "client-key", us_file, f"user {user_name!r}"),
        token=user.get("token") or None,
        token_file=_path(user.get("tokenFile"), us_file) if user.get("tokenFile") else None,
        username=user.get("username"),
        password=user.get("password"),
    )
    if cfg.insecure and cfg.ca_data:
        raise KubeconfigError(
            f"kubeconfig {cl_file}: cluster {cluster_name!r} sets both insecure-skip-tls-verify and a "
            "certificate authority; drop one (kubectl refuses this too)"
        )
    if bool(cfg.cert_data) != bool(cfg.key_data):
        raise KubeconfigError(f"kubeconfig {us_file}: user {user_name!r} has a client certificate without a key, or a key without one")
    if cfg.cert_data and cfg.key_data:
        try:
            # a bare client context: checking that the pair loads needs no trust store (the
            # system roots are slow to parse, on every start and every `declop dev` reload)
            load_cert_chain(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), cfg.cert_data, cfg.key_data)
        except ssl.SSLError as exc:
            raise KubeconfigError(f"kubeconfig {us_file}: user {user_name!r}: the client certificate and key do not load ({exc.reason or exc})") from exc
    if cfg.ca_data:
        try:
            ssl.create_default_context(cadata=cfg.ca_data.decode(errors="replace"))
        except (ssl.SSLError, ValueError) as exc:
            raise KubeconfigError(f"kubeconfig {cl_file}: cluster {cluster_name!r}: the certificate authority is not a PEM certificate") from exc
    if "auth-provider" in user:
        provider = (user.get("auth-provider") or {}).get("name", "?")
        raise KubeconfigError(
            f"kubeconfig {us_file}: user {user_name!r} uses auth-provider {provider!r}, which client-go removed; "
            "use an exec credential plugin (e.g. kubelogin, gke-gcloud-auth-plugin)"
        )
    if user.get("exec"):
        cfg.exec_plugin = _exec(user["exec"], us_file, user_name, cluster, server)
    return cfg


def _section(entry: dict[str, Any], key: str, path: str) -> dict[str, Any]:
    value = entry.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise KubeconfigError(f"kubeconfig {path}: {key} {entry.get('name')!r} must be a mapping")
    return value


def _path(value: Any, kubeconfig: str) -> str:
    path = os.path.expanduser(str(value))
    return path if os.path.isabs(path) else os.path.join(os.path.dirname(os.path.abspath(kubeconfig)), path)


def _data(section: Mapping[str, Any], key: str, kubeconfig: str, what: str) -> bytes | None:
    """``key-data`` (base64) wins over ``key`` (a file, relative to the kubeconfig), as in client-go."""
    data = section.get(f"{key}-data")
    if data:
        try:
            return base64.b64decode(str(data), validate=True)
        except ValueError as exc:
            raise KubeconfigError(f"kubeconfig {kubeconfig}: {what}: {key}-data is not valid base64") from exc
    if section.get(key):
        path = _path(section[key], kubeconfig)
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as exc:
            raise KubeconfigError(f"kubeconfig {kubeconfig}: {what}: cannot read {key} {path}: {exc.strerror}") from exc
    return None


def _exec(raw: Any, path: str, user: str | None, cluster: Mapping[str, Any], server: str) -> ExecPlugin:
    if not isinstance(raw, dict) or not raw.get("command"):
        raise KubeconfigError(f"kubeconfig {path}: user {user!r}: exec needs a command")
    args = raw.get("args") or []
    env = raw.get("env") or []
    if not isinstance(args, list) or not isinstance(env, list) or not all(isinstance(e, dict) and "name" in e for e in env):
        raise KubeconfigError(f"kubeconfig {path}: user {user!r}: exec args must be a list and env a list of name/value")
    command = str(raw["command"])
    if os.sep in command and not os.path.isabs(command):
        command = _path(command, path)  # relative to the kubeconfig, as client-go resolves it
    info = None
    if raw.get("provideClusterInfo"):
        info = {"server": server, "tls-server-name": cluster.get("tls-server-name"), "insecure-skip-tls-verify": bool(cluster.get("insecure-skip-tls-verify"))}
        if cluster.get("certificate-authority-data"):
            info["certificate-authority-data"] = cluster["certificate-authority-data"]
    return ExecPlugin(
        command=command,
        args=tuple(str(a) for a in args),
        env=tuple((str(e["name"]), str(e.get("value", ""))) for e in env),
        api_version=str(raw.get("apiVersion") or "client.authentication.k8s.io/v1"),
        install_hint=str(raw.get("installHint") or ""),
        cluster=info,
    )


def from_kubernetes(cfg: Any) -> RestConfig:
    """A :class:`RestConfig` from a ``kubernetes.client.Configuration`` (host, CA file, client
    cert files, bearer api_key, verify_ssl) — for tests and library users who have one."""
    if isinstance(cfg, RestConfig):
        return cfg

    def read(path: str | None) -> bytes | None:
        if not path:
            return None
        with open(path, "rb") as f:
            return f.read()

    token = None
    for value in (getattr(cfg, "api_key", None) or {}).values():
        token = str(value).removeprefix("Bearer ").strip() or None
    return RestConfig(
        host=str(cfg.host).rstrip("/"),
        source="the given Configuration",
        ca_data=read(getattr(cfg, "ssl_ca_cert", None)),
        insecure=not getattr(cfg, "verify_ssl", True),
        cert_data=read(getattr(cfg, "cert_file", None)),
        key_data=read(getattr(cfg, "key_file", None)),
        token=token,
    )


def pod_namespace(fallback: Any = "default") -> Any:
    """The namespace this Pod runs in (from the service-account mount), else ``fallback``."""
    sa_dir = os.environ.get("DECLOP_SERVICE_ACCOUNT_DIR") or SERVICE_ACCOUNT_DIR
    try:
        with open(os.path.join(sa_dir, "namespace")) as f:
            return f.read().strip() or fallback
    except OSError:
        return fallback
