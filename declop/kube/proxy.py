"""Proxies as Go's ``net/http`` picks and prints them: which proxy a server is reached through
(``HTTPS_PROXY``/``HTTP_PROXY`` unless ``NO_PROXY`` exempts the host, as
``golang.org/x/net/http/httpproxy`` reads it — CIDRs included), and a proxy URL as it may be
printed (its password as ``xxxxx``, as ``url.Redacted``).

Invariant: nothing here prints or logs; the functions only compute.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["env_proxy", "no_proxy_matches", "redact_text", "redact_url"]


def redact_url(url: str) -> str:
    """``url`` with the password of its userinfo replaced by ``xxxxx``, as Go's ``url.Redacted``
    prints it (``http://user:xxxxx@proxy:3128``); other URLs unchanged."""
    import urllib.parse

    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None and "@" not in parts.netloc:
        return url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}{':xxxxx' if colon else ''}@{hostport}"))


def redact_text(text: str, url: str | None) -> str:
    """``text`` with ``url`` and its password (as written and percent-decoded) redacted: for
    messages that quote an error of a library that may have printed the proxy URL."""
    if not url:
        return text
    import urllib.parse

    text = text.replace(url, redact_url(url))
    try:
        password = urllib.parse.urlsplit(url).password
    except ValueError:
        return text
    if password:
        for form in {password, urllib.parse.unquote(password)}:
            text = text.replace(form, "xxxxx")
    return text


def no_proxy_matches(host: str, port: str, no_proxy: str) -> bool:
    """Whether ``NO_PROXY`` exempts ``host:port`` from the proxy, as Go's
    ``golang.org/x/net/http/httpproxy`` decides (what kubectl and client-go do):

    - entries are comma-separated, trimmed, case-insensitive; ``*`` matches everything;
    - a CIDR (``10.0.0.0/8``, ``fd00::/8``) matches IP hosts inside it, on any port;
    - an IP (``10.1.2.3``, ``10.1.2.3:6443``, ``[::1]:6443``) matches that IP (and port, if given);
    - a domain (``example.com``) matches itself and its subdomains; ``.example.com`` and
      ``*.example.com`` only its subdomains; ``:port`` restricts the match to that port.
    """
    import ipaddress

    host = host.strip().lower().strip("[]")
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        if "/" in entry:
            try:
                network = ipaddress.ip_network(entry, strict=False)
            except ValueError:
                network = None
            if network is not None:
                if ip is not None and ip.version == network.version and ip in network:
                    return True
                continue
        entry_host, entry_port = _split_host_port(entry)
        if not entry_host:
            continue  # no host part: malformed, ignored (as Go does)
        try:
            entry_ip = ipaddress.ip_address(entry_host)
        except ValueError:
            entry_ip = None
        if entry_ip is not None:
            if ip is not None and ip == entry_ip and entry_port in ("", port):
                return True
            continue
        if entry_host.startswith("*."):
            entry_host = entry_host[1:]
        match_host = not entry_host.startswith(".")
        suffix = entry_host if not match_host else "." + entry_host
        if (host.endswith(suffix) or (match_host and host == suffix[1:])) and entry_port in ("", port):
            return True
    return False


def _split_host_port(entry: str) -> tuple[str, str]:
    """Go's ``net.SplitHostPort`` for a NO_PROXY entry, else the entry as a host without port."""
    if entry.startswith("["):
        end = entry.find("]")
        if end != -1 and entry[end + 1 : end + 2] == ":" and entry[end + 2 :].isdigit():
            return entry[1:end], entry[end + 2 :]
        return entry.strip("[]"), ""
    head, colon, tail = entry.rpartition(":")
    if colon and ":" not in head and tail.isdigit():
        return head, tail
    return entry, ""


def env_proxy(server: str, env: Mapping[str, str]) -> str | None:
    """The proxy Go's ``http.ProxyFromEnvironment`` picks for ``server``: ``HTTPS_PROXY`` (or
    ``HTTP_PROXY`` for http servers), unless the host is ``localhost`` or a loopback address
    (never proxied) or ``NO_PROXY`` exempts it (:func:`no_proxy_matches`: CIDRs, IPs, domains
    and ports, as Go reads them)."""
    import ipaddress
    import urllib.parse

    scheme = "https" if server.startswith("https") else "http"
    proxy = env.get(f"{scheme}_proxy") or env.get(f"{scheme.upper()}_PROXY")
    if not proxy:
        return None
    no_proxy = env.get("no_proxy") or env.get("NO_PROXY") or ""
    parts = urllib.parse.urlsplit(server)
    host = parts.hostname or ""
    try:
        port = str(parts.port or (443 if scheme == "https" else 80))
    except ValueError:
        port = ""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if loopback:
        return None
    if no_proxy and no_proxy_matches(host, port, no_proxy):
        return None
    return proxy
