"""declop.kube.proxy: NO_PROXY read as Go's golang.org/x/net/http/httpproxy reads it (CIDRs,
IPs, domains, ports), and proxy URLs printed as Go's url.Redacted prints them."""

from __future__ import annotations

import pytest

from declop.kube.proxy import env_proxy, no_proxy_matches, redact_text, redact_url


@pytest.mark.parametrize(
    ("host", "port", "no_proxy", "exempt"),
    [
        # CIDRs (ignored before: Python's urllib does not read them, Go does)
        ("10.96.0.1", "443", "10.0.0.0/8", True),
        ("10.96.0.1", "443", "192.168.0.0/16, 10.96.0.0/12", True),
        ("11.0.0.1", "443", "10.0.0.0/8", False),
        ("fd00::1", "443", "fd00::/8", True),
        ("fd00::1", "443", "10.0.0.0/8", False),
        ("apiserver.example", "443", "10.0.0.0/8", False),  # a CIDR never matches a name
        # IPs, with or without a port
        ("10.0.0.5", "6443", "10.0.0.5", True),
        ("10.0.0.5", "6443", "10.0.0.5:6443", True),
        ("10.0.0.5", "443", "10.0.0.5:6443", False),
        ("::2", "6443", "[::2]:6443", True),
        # domains: the domain and its subdomains; a leading dot or *. only subdomains
        ("example.com", "443", "example.com", True),
        ("api.example.com", "443", "example.com", True),
        ("notexample.com", "443", "example.com", False),
        ("example.com", "443", ".example.com", False),
        ("api.example.com", "443", ".example.com", True),
        ("api.example.com", "443", "*.example.com", True),
        ("API.Example.com", "443", " EXAMPLE.COM ", True),
        ("api.example.com", "6443", "example.com:443", False),
        ("api.example.com", "443", "example.com:443", True),
        # everything, nothing, malformed
        ("anything", "443", "*", True),
        ("anything", "443", "", False),
        ("anything", "443", ",:443,", False),
    ],
)
def test_no_proxy_like_go_httpproxy(host: str, port: str, no_proxy: str, exempt: bool) -> None:
    assert no_proxy_matches(host, port, no_proxy) is exempt


def test_proxy_urls_are_redacted_as_go_does() -> None:
    assert redact_url("http://alice:s3cret@proxy:3128") == "http://alice:xxxxx@proxy:3128"
    assert redact_url("http://alice@proxy:3128") == "http://alice@proxy:3128"
    assert redact_url("http://proxy:3128/") == "http://proxy:3128/"
    text = "cannot connect via http://alice:p%40ss@proxy:3128 (p@ss)"
    assert redact_text(text, "http://alice:p%40ss@proxy:3128") == "cannot connect via http://alice:xxxxx@proxy:3128 (xxxxx)"


def test_env_proxy_honours_a_cidr_and_never_proxies_loopback() -> None:
    env = {"HTTPS_PROXY": "http://corp:3128", "NO_PROXY": "10.0.0.0/8"}
    assert env_proxy("https://10.96.0.1:443", env) is None
    assert env_proxy("https://172.16.0.1:443", env) == "http://corp:3128"
    assert env_proxy("https://127.0.0.1:6443", {"HTTPS_PROXY": "http://corp:3128"}) is None
    assert env_proxy("http://api.example:80", {"HTTP_PROXY": "http://plain:3128", "NO_PROXY": "api.example:80"}) is None
