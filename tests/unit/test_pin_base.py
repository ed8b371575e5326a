"""tools/pin-base.sh (make pin-base): the Dockerfile's base moves to the digest a registry reports
for its tag, with the source line rewritten; without a registry, one line and nothing changed.
The registry is a local HTTP server speaking the two requests the script makes (token, HEAD
manifest), so the test needs no network."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "pin-base.sh"
OLD = "sha256:" + "1" * 64
NEW = "sha256:" + "2" * 64
DOCKERFILE = f"""# header
# base-digest-source: somewhere
ARG PYTHON_IMAGE=python:3.11-slim-bookworm@{OLD}
FROM ${{PYTHON_IMAGE}}
"""


class Registry(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str, str, str]] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # the token endpoint
        Registry.seen.append(("GET", self.path, ""))
        body = json.dumps({"token": "t0ken"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_HEAD(self) -> None:  # the manifest
        Registry.seen.append(("HEAD", self.path, self.headers.get("Authorization", "")))
        known = self.path == "/v2/library/python/manifests/3.11-slim-bookworm"
        self.send_response(200 if known else 404)
        if known:
            self.send_header("Docker-Content-Digest", NEW)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture
def registry() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Registry.seen = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def pin(dockerfile: Path, registry: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DOCKERFILE": str(dockerfile),
        "DECLOP_REGISTRY": registry,
        "DECLOP_REGISTRY_AUTH": f"{registry}/token?service=test",
    }
    return subprocess.run(
        [str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_the_digest_moves_to_what_the_registry_says_for_the_tag(tmp_path: Path, registry: str) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(DOCKERFILE)
    result = pin(dockerfile, registry)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"python:3.11-slim-bookworm@{NEW} (was python:3.11-slim-bookworm@{OLD})\n"
    lines = dockerfile.read_text().splitlines()
    assert lines[2] == f"ARG PYTHON_IMAGE=python:3.11-slim-bookworm@{NEW}"
    assert lines[1].startswith(f"# base-digest-source: {registry}, tools/pin-base.sh on 20")
    assert [lines[0], lines[3]] == ["# header", "FROM ${PYTHON_IMAGE}"]
    assert Registry.seen[0][1] == "/token?service=test&scope=repository:library/python:pull"
    assert Registry.seen[1] == ("HEAD", "/v2/library/python/manifests/3.11-slim-bookworm", "Bearer t0ken")
    again = pin(dockerfile, registry)
    assert again.stdout == f"python:3.11-slim-bookworm@{NEW} (unchanged)\n"


def test_an_unknown_tag_or_no_registry_is_one_line_and_changes_nothing(
    tmp_path: Path, registry: str
) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(DOCKERFILE)
    unknown = pin(dockerfile, registry, "python:3.99-nope")
    assert unknown.returncode == 1
    assert unknown.stderr == (
        f"error: cannot read the manifest of python:3.99-nope from {registry} "
        "(unknown tag or no registry access); the Dockerfile is unchanged\n"
    )
    closed = pin(dockerfile, "http://127.0.0.1:1")
    assert closed.returncode == 1
    assert closed.stderr == (
        "error: cannot get a pull token for library/python from http://127.0.0.1:1/token "
        "(no registry access?); the Dockerfile is unchanged\n"
    )
    assert dockerfile.read_text() == DOCKERFILE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Dockerfile"]  # no temporary left


def test_the_repositorys_dockerfile_pins_its_base_by_digest_with_the_tag_beside_it() -> None:
    text = (ROOT / "Dockerfile").read_text()
    (line,) = [l for l in text.splitlines() if l.startswith("ARG PYTHON_IMAGE=")]
    image, _, digest = line.removeprefix("ARG PYTHON_IMAGE=").partition("@")
    assert image == "python:3.11-slim-bookworm"
    assert digest.startswith("sha256:") and len(digest) == 71 and int(digest[7:], 16) >= 0
    assert "\n# base-digest-source: " in text
