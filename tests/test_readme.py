"""Every fenced code block of the README (and of the docs pages in DOCUMENTS) is executed or checked.

The convention (also in docs/testing.md, "The docs are tested"): a block's language tag says
what it is, and so what this test does with it.

- ``python``:
  - first line ``# from <path>`` (or ``# <path>``): an excerpt of a repository file that its own
    tests run; the block must appear in that file verbatim (contiguous lines);
  - defines ``def test_…``: written to a file of its own and run with pytest (the declop plugin
    and its fixtures, a real control plane) in a subprocess from the repository root; all of a
    page's test blocks share one pytest run, and every test in them must pass;
  - registers handlers (``@declop.reconciler``, ``declop.index``, ``@declop.validator``,
    ``@declop.mutator``, ``@declop.converter``) and defines no test: a handler
    module, written to a file and loaded with ``declop.loader.load`` in a subprocess — it must
    import cleanly and register at least one handler;
  - anything else: a script, run with ``python`` from the repository root; it must exit 0.
- ``bash`` / ``sh`` / ``shell``: commands, one a line (``\\`` continues one). ``console``: lines
  starting with ``$ `` are commands, the others their output. Each command is checked as far as
  is honest without a cluster: ``declop …`` parses with declop's own CLI (the command exists, each
  option is known); ``make T`` names a target of the Makefile; ``kubectl``/``helm …`` are asked for
  ``--help`` with the same arguments (the subcommand and flags exist) and ``helm install`` renders
  with ``helm template``; every argument that names a repository file must exist; any other
  program must be one of KNOWN_PROGRAMS. ``<placeholders>`` and ``$VARIABLES`` are not checked;
  after ``cd`` into a folder the repository does not have (the user's own project), neither are
  file names.
- ``text``: output only, never run. A line shaped like a declop log line (``INFO message {…}``)
  must be one: a level, a message some declop or example code logs, and a JSON object of pairs.
- ``yaml`` / ``json``: must parse. ``dockerfile``: every instruction is a Dockerfile instruction.
- Any other tag, or none, fails: say what the block is.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
import yaml

from declop import cli

ROOT = Path(__file__).resolve().parents[1]

#: the pages whose blocks this test runs
DOCUMENTS = ("README.md", "docs/testing.md", "docs/unit-testing.md", "docs/coming-from-kopf.md", "docs/webhooks.md", "docs/sharding.md", "docs/typed.md", "docs/rbac.md", "docs/simulation.md", "docs/changes.md", "docs/timers.md", "docs/daemons.md", "docs/steps.md", "docs/embedding.md")

LANGUAGES = {"python", "bash", "sh", "shell", "console", "text", "yaml", "json", "dockerfile"}
SHELL = {"bash", "sh", "shell", "console"}
#: programs a shell block may run besides declop, make, kubectl and helm
KNOWN_PROGRAMS = {"cd", "export", "pip", "python", "python3", "pytest", "curl", "git", "ls", "cat", "echo", "source", "sudo"}
#: top-level entries of the repository: a word starting with one of these names a repository file
REPO_TOP = {p.name for p in ROOT.iterdir() if not p.name.startswith(".")}
FILE_LIKE = re.compile(r"^(\./)?[\w.-]+(/[\w.*-]+)*\.(py|ya?ml|json|md|txt|toml|cfg|tgz|whl|tar\.gz|sh)$")
LOG_LINE = re.compile(r"^(DEBUG|INFO|WARNING|ERROR) (.+?) (\{.*\})$")
DOCKERFILE_INSTRUCTIONS = {
    "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME", "USER",
    "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL",
}  # fmt: skip


@dataclass(frozen=True)
class Block:
    """One fenced block: where it starts (``document:line``), its language tag and its text."""

    document: str
    line: int
    lang: str
    text: str

    def __str__(self) -> str:
        return f"{self.document}:{self.line}"


def blocks_of(document: str) -> list[Block]:
    """The fenced blocks of a Markdown file, in order (``` or ~~~ fences, any indentation)."""
    found: list[Block] = []
    lines = (ROOT / document).read_text().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)", lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group(1), m.group(2), m.group(3).lower()
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        found.append(Block(document, start, lang, "\n".join(body) + "\n"))
        i += 1
    return found


ALL = [b for d in DOCUMENTS for b in blocks_of(d)]


def of(*langs: str) -> list[Block]:
    return [b for b in ALL if b.lang in langs]


def python_kind(block: Block) -> str:
    first = block.text.lstrip().splitlines()[0] if block.text.strip() else ""
    if re.match(r"^#\s*(from\s+)?[\w./-]+\.py\s*$", first):
        return "excerpt"
    if re.search(r"^\s*(async\s+)?def test_", block.text, re.M):
        return "test"
    if re.search(r"@(declop|\w*registry)\.(reconciler|timer|daemon|validator|mutator|converter)\(|declop\.index\(", block.text):
        return "handlers"
    return "script"


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTEST_ADDOPTS", None)
    return env


# -- every block says what it is ---------------------------------------------------------------


def test_the_documents_have_blocks_and_each_says_what_it_is() -> None:
    for document in DOCUMENTS:
        assert blocks_of(document), f"{document} has no code block (or DOCUMENTS is stale)"
    unknown = [f"{b} ({b.lang or 'no tag'})" for b in ALL if b.lang not in LANGUAGES]
    assert unknown == [], f"tag these blocks with one of {sorted(LANGUAGES)}"


# -- python ------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", [b for b in of("python") if python_kind(b) == "excerpt"], ids=str)
def test_a_python_excerpt_is_verbatim_in_its_file(block: Block) -> None:
    first, rest = block.text.lstrip().split("\n", 1)
    path = ROOT / re.sub(r"^#\s*(from\s+)?", "", first).strip()
    assert path.is_file(), f"{block}: {path} does not exist"
    assert rest.strip(), f"{block}: nothing but the file name"
    assert textwrap.dedent(rest).strip("\n") in path.read_text(), f"{block}: not verbatim in {path.relative_to(ROOT)}"


@pytest.mark.parametrize("block", [b for b in of("python") if python_kind(b) == "handlers"], ids=str)
def test_a_handler_block_loads_with_the_loader(block: Block, tmp_path: Path) -> None:
    handlers = tmp_path / "handlers.py"
    handlers.write_text(block.text)
    code = (
        "import sys\n"
        "from declop.loader import load\n"
        "from declop.registry import default_registry\n"
        "load([sys.argv[1]])\n"
        "print(len(default_registry) + len(default_registry.webhooks))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(handlers)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{block}: {done.stderr}"
    assert int(done.stdout.split()[-1]) >= 1, f"{block}: registers no handler"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("block", [b for b in of("python") if python_kind(b) == "script"], ids=str)
def test_a_python_script_block_runs(block: Block, tmp_path: Path) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(block.text)
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, f"{block}:\n{done.stdout}\n{done.stderr}"


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "document", [d for d in DOCUMENTS if any(b.document == d and python_kind(b) == "test" for b in of("python"))]
)
def test_the_test_blocks_pass_with_pytest_on_a_real_control_plane(document: str, tmp_path: Path) -> None:
    tests = [b for b in of("python") if b.document == document and python_kind(b) == "test"]
    expected = 0
    for block in tests:
        (tmp_path / f"test_block_{block.line}.py").write_text(block.text)
        expected += len(re.findall(r"^\s*(?:async\s+)?def test_", block.text, re.M))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=840,
    )  # fmt: skip
    assert done.returncode == 0, f"{document}: {', '.join(map(str, tests))}:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
    assert re.search(rf"\b{expected} passed\b", done.stdout), done.stdout[-2000:]


# -- shell -------------------------------------------------------------------------------------


def shell_commands(block: Block) -> Iterator[tuple[int, list[str]]]:
    """(line, words) of each simple command; ``&&``, ``||``, ``;`` and ``|`` separate commands."""
    lines = block.text.splitlines()
    i = 0
    while i < len(lines):
        number, line = block.line + 1 + i, lines[i]
        while line.endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line[:-1] + " " + lines[i]
        i += 1
        if block.lang == "console":
            if not line.startswith("$ "):
                continue
            line = line[2:]
        line = re.sub(r"<[^<>]*>", "PLACEHOLDER", line)
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        for word in lexer:
            if word in (";", "&&", "||", "|", "&"):
                if words:
                    yield number, words
                words = []
            else:
                words.append(word)
        if words:
            yield number, words


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([\w.-]+)\s*:(?!=)", text, re.M))


def check_declop(args: list[str]) -> None:
    command: click.Command = cli.cli
    name = "declop"
    while isinstance(command, click.Group) and args and not args[0].startswith("-"):
        sub = command.get_command(click.Context(command), args[0])
        assert sub is not None, f"there is no command `{name} {args[0]}`"
        command, name, args = sub, f"{name} {args[0]}", args[1:]
    try:
        command.make_context(name, list(args))
    except click.exceptions.Exit:
        pass  # --help, --version
    except click.UsageError as exc:
        raise AssertionError(f"`{name} {' '.join(args)}`: {exc.format_message()}") from None


def check_tool(tool: str, args: list[str], assets: str) -> None:
    """kubectl/helm: the subcommand and flags exist (``--help``); helm install renders as a template."""
    env = {**subprocess_env(), "PATH": f"{assets}:{os.environ['PATH']}", "KUBECONFIG": "/nonexistent"}
    if tool == "helm" and args[:1] in (["install"], ["upgrade"]):
        args = ["template", *[a for a in args[1:] if a not in ("--install", "--wait", "--create-namespace")]]
        done = subprocess.run([tool, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    else:
        done = subprocess.run([tool, *args, "--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"`{tool} {' '.join(args)}`: {done.stderr.strip()}"


def check_paths(words: list[str], *, in_repo: bool) -> None:
    extras = re.findall(r"^(\w+)\s*=", (ROOT / "setup.cfg").read_text().split("[options.extras_require]")[1].split("\n[")[0], re.M)
    for word in words:
        for part in [word, *word.split("=")[1:]]:  # --set-file key=path, -f=path
            if "PLACEHOLDER" in part or "$" in part or "://" in part:
                continue
            m = re.match(r"^(?:declop|\.)\[([\w,]+)\]$", part)
            if m:
                assert set(m.group(1).split(",")) <= set(extras), f"{part}: declop has extras {extras}"
                continue
            top = part.removeprefix("./").split("/")[0]
            if not in_repo or not (FILE_LIKE.match(part) or (top in REPO_TOP and "/" in part)):
                continue
            if top in ("dist", "build") and "*" in part:
                continue  # built artifacts (make dist, make image)
            matches = list(ROOT.glob(part.removeprefix("./"))) if "*" in part else [ROOT / part]
            assert any(p.exists() for p in matches), f"{part} does not exist in the repository"


@pytest.fixture(scope="module")
def tool_assets() -> str:
    from declop.testing import find_assets

    return find_assets()


@pytest.mark.parametrize("block", of(*SHELL), ids=str)
def test_each_shell_command_exists_with_its_options_and_files(block: Block, request: pytest.FixtureRequest) -> None:
    targets = makefile_targets()
    in_repo = True
    checked = 0
    for line, words in shell_commands(block):
        while words and (re.match(r"^[A-Za-z_]\w*=", words[0]) or words[0] in ("sudo", "-E")):
            words = words[1:]  # VAR=value prefixes, sudo -E
        if not words:
            continue
        where = f"{block.document}:{line}"
        program, args = words[0], words[1:]
        if program == "cd":
            in_repo = bool(args) and (ROOT / args[0]).is_dir()
        elif program == "declop" or args[:2] == ["-m", "declop"]:
            check_declop(args[2:] if program != "declop" else args)
        elif program == "make":
            for target in (a for a in args if not a.startswith("-") and "=" not in a):
                assert target in targets, f"{where}: the Makefile has no target {target!r}"
        elif program in ("kubectl", "helm"):
            check_tool(program, args, request.getfixturevalue("tool_assets"))
        else:
            assert program in KNOWN_PROGRAMS, f"{where}: unknown program {program!r} (a typo? else add it to KNOWN_PROGRAMS)"
        check_paths(args, in_repo=in_repo)
        checked += 1
    assert checked or block.lang == "console", f"{block}: no command in a {block.lang} block; tag output as text"


# -- output, data ------------------------------------------------------------------------------


def logged_messages() -> str:
    """The source of every module that may log: a message must be a literal in one of them."""
    files = [*ROOT.glob("declop/**/*.py"), *ROOT.glob("examples/**/*.py")]
    return "\n".join(f.read_text() for f in files)


@pytest.mark.parametrize("block", of("text", "console"), ids=str)
def test_log_lines_in_output_blocks_are_real_declop_lines(block: Block) -> None:
    sources = logged_messages()
    for offset, line in enumerate(block.text.splitlines()):
        m = LOG_LINE.match(line.strip())
        if not m or (block.lang == "console" and line.startswith("$ ")):
            continue
        where = f"{block.document}:{block.line + 1 + offset}"
        level, message, pairs = m.groups()
        assert f'"{message}"' in sources, f"{where}: no code logs {message!r}"
        try:
            parsed = json.loads(pairs)
        except ValueError:
            raise AssertionError(f"{where}: the pairs are not the JSON declop prints: {pairs}") from None
        if "reconcileID" in parsed:
            assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", parsed["reconcileID"]), where
            assert list(parsed)[:2] == ["controller", "namespace"] and list(parsed)[-1] == "reconcileID", where


@pytest.mark.parametrize("block", of("yaml", "json", "dockerfile"), ids=str)
def test_data_blocks_parse(block: Block) -> None:
    if block.lang == "yaml":
        assert list(yaml.safe_load_all(block.text)), block
    elif block.lang == "json":
        json.loads(block.text)
    else:
        for line in block.text.replace("\\\n", " ").splitlines():
            word = line.split("#", 1)[0].split()[:1]
            assert not word or word[0].upper() in DOCKERFILE_INSTRUCTIONS, f"{block}: {line!r}"


def test_the_readme_says_how_its_blocks_are_tested() -> None:
    head = (ROOT / "README.md").read_text().split("\n", 3)[:3]
    assert any("tests/test_readme.py" in line for line in head), "keep the comment at the top of README.md"
