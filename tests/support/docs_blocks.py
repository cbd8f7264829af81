"""Read the code blocks of the README and docs/, and run the ones marked runnable.

Two HTML comments (invisible on GitHub) mark blocks, on the line right before the fence:

* ``<!-- runnable -->``: the block runs as written. ``bash``/``sh``/``shell`` blocks run with
  ``bash -e -o pipefail``, ``python`` blocks with the venv's python (from stdin, as pasted),
  ``yaml`` blocks are a config that ``tool-server check-config`` must accept (with the page's
  folder on ``PYTHONPATH``, for the page's own tool modules). Options after a colon, e.g.
  ``<!-- runnable: server expect="3371" -->``:

  - ``server``: a tool server with the built-in config answers at the docs' address
    (``127.0.0.1:8000`` / ``localhost:8000``), the one ``tool-server serve`` gives;
  - ``expect="REGEX"``: the output (stdout and stderr) must match REGEX (``^`` and ``$`` match
    at lines): ``curl -s`` exits 0 on an error answer, a script that prints a wrong value too.

* ``<!-- file: NAME -->``: the block is the file NAME, for formats without comments (JSON).
  Blocks in other formats name their file in their first line, ``# file: NAME``.

The blocks of one page run in page order, in one scratch directory that looks like the
repository's root (a symlink to each top-level entry of a clone, and the venvs), as a reader
follows the page: files named by file blocks are written there when the page reaches them,
and what a block leaves (data, runs, a ``tool-server serve &``) is there for the next. The
venv's ``bin`` comes first on ``PATH`` (what ``source .venv/bin/activate`` does). The docs'
port 8000 is replaced by a free one (in the block's text and ``TOOLFACTORY__SERVER__PORT``),
so runs never clash with a server on 8000 or with each other. Background processes a page
starts are stopped when the page ends.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support.processes import started

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
DOCS_PORT = 8000
_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^`\n]*)$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<kind>runnable|file)\s*(?::\s*(?P<options>.*?))?\s*-->\s*$")
_FILE_LINE = re.compile(r"^# file: (\S+)$")
RUNNERS = {"bash": "bash", "sh": "bash", "shell": "bash", "python": "python", "yaml": "yaml"}
OPTIONS = {"server", "expect"}


class DocsMarkupError(ValueError):
    """A marker the runner cannot follow: say where and what is allowed, never skip the block."""


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # 1-based line of the opening fence
    lang: str  # the first word of the info string ("" when none)
    body: str  # the text between the fences, as the reader sees it (indent removed)
    file: str | None = None  # the file this block is, from `# file:` or `<!-- file: -->`
    runnable: dict[str, str] | None = None  # the runnable marker's options; None: not run
    content: str = field(default="", repr=False)  # the file's text (body minus a `# file:` line)

    @property
    def where(self) -> str:
        return f"{_shown(self.doc)}:{self.line}"


def _shown(doc: Path) -> str:
    return str(doc.relative_to(REPO)) if doc.is_relative_to(REPO) else str(doc)


def blocks(doc: Path) -> list[Block]:
    """Every fenced code block of ``doc``, with its marker (if any) and the file it names."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        end = i + 1
        while end < len(lines) and not _closes(lines[end], fence):
            end += 1
        if end == len(lines):
            raise DocsMarkupError(f"{_shown(doc)}:{i + 1}: code block is never closed")
        body = "".join(line[indent:] + "\n" for line in lines[i + 1 : end])
        marker = _MARKER.match(lines[i - 1]) if i > 0 else None
        lang = (opening["info"].split() or [""])[0]
        found.append(_block(doc, i + 1, lang, body, marker))
        i = end + 1
    fences = {block.line - 1 for block in found}  # 1-based line numbers of the markers' blocks
    for number, line in enumerate(lines, 1):
        if _MARKER.match(line) and number not in fences:
            raise DocsMarkupError(
                f"{_shown(doc)}:{number}: {line.strip()} precedes no code block (next line)"
            )
    return found


def _closes(line: str, fence: str) -> bool:
    """CommonMark: a run of the opening's character, at least as long, alone on its line."""
    stripped = line.strip()
    return len(stripped) >= len(fence) and set(stripped) == {fence[0]}


def _block(doc: Path, line: int, lang: str, body: str, marker: re.Match[str] | None) -> Block:
    where = f"{_shown(doc)}:{line}"
    name, content, runnable = None, body, None
    first = _FILE_LINE.match(body.split("\n", 1)[0])
    if first is not None:
        name, content = first.group(1), body.split("\n", 1)[1]
    if marker is not None and marker["kind"] == "file":
        if name is not None or not marker["options"]:
            raise DocsMarkupError(
                f"{where}: write the file name once: `<!-- file: NAME -->` or `# file: NAME`"
            )
        name = marker["options"].strip()
    if marker is not None and marker["kind"] == "runnable":
        if lang not in RUNNERS:
            raise DocsMarkupError(f"{where}: a runnable block must be one of {sorted(RUNNERS)}, not {lang!r}")
        runnable = {}
        for option in shlex.split(marker["options"] or ""):
            key, _, value = option.partition("=")
            if key not in OPTIONS:
                raise DocsMarkupError(f"{where}: unknown runnable option {key!r} (known: {sorted(OPTIONS)})")
            runnable[key] = value
    return Block(doc, line, lang, body, name, runnable, content)


def files_in(doc: Path) -> dict[str, str]:
    """The files a page shows, by name: what a reader writes to follow it."""
    return {b.file: b.content for b in blocks(doc) if b.file is not None}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def answers(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url + "/readyz", timeout=2).status_code in (200, 503)
    return False


@dataclass
class BlockRun:
    block: Block
    returncode: int
    output: str

    def failure(self) -> str | None:
        """Why this run does not count as the block working, or None."""
        expect = (self.block.runnable or {}).get("expect")
        if self.returncode != 0:
            why = f"exited {self.returncode}"
        elif expect and re.search(expect, self.output, re.MULTILINE) is None:
            why = f"printed nothing that matches {expect!r}"
        else:
            return None
        return f"{self.block.where}: the {self.block.lang} block {why}.\n--- block\n{self.block.body}--- output\n{self.output}"


class PageRunner:
    """Runs one page's runnable blocks in order in ``workdir`` (see the module docstring)."""

    def __init__(self, workdir: Path, *, timeout_s: float = 600.0) -> None:
        self.workdir = workdir
        self.timeout_s = timeout_s
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._groups: list[int] = []  # process groups of the blocks: background jobs live on
        self._server = contextlib.ExitStack()  # the runner's own server, for `server` blocks
        for name in _repository_entries():
            if not (workdir / name).exists():
                (workdir / name).symlink_to(REPO / name)
        self.scratch = workdir / ".docs-blocks"  # the runner's own files: scripts and logs
        self.scratch.mkdir(exist_ok=True)
        venv_bin = REPO / ".venv" / "bin"
        self.env = {
            **os.environ,
            "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
            "VIRTUAL_ENV": str(REPO / ".venv"),
            "TOOLFACTORY__SERVER__PORT": str(self.port),
            # A compose stack a page starts (the README's container block) is the runner's own,
            # never one the reader runs from the same checkout (project "compose").
            "COMPOSE_PROJECT_NAME": f"toolfactory-docs-{self.port}",
            "PYTHONUNBUFFERED": "1",
        }
        self.env.pop("PYTHONPATH", None)  # as a reader's shell: the docs say where they need it

    def __enter__(self) -> PageRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        for group in self._groups:
            _stop_group(group)
        self._server.close()

    def write(self, block: Block) -> None:
        assert block.file is not None
        path = self.workdir / block.file
        if path.is_symlink():  # a name the repository has (README.md): never write through it
            path.unlink()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block.content)

    def run(self, block: Block) -> BlockRun:
        assert block.runnable is not None
        if "server" in block.runnable:
            self._ensure_server()
        else:  # a block without `server` gets none of ours: the page may start its own on the port
            self._server.close()
        text = re.sub(rf"\b(127\.0\.0\.1|localhost):{DOCS_PORT}\b", f"127.0.0.1:{self.port}", block.body)
        script = self.scratch / f"block-{block.line}.{'py' if block.lang == 'python' else 'sh'}"
        script.write_text(text)
        kind = RUNNERS[block.lang]
        if kind == "bash":
            cmd = ["bash", "-e", "-o", "pipefail", str(script)]
        elif kind == "python":
            cmd = ["python", "-"]  # from stdin, as pasted: the page's folder comes first on sys.path
        else:
            config = self.workdir / block.file if block.file else self.scratch / f"block-{block.line}.yaml"
            config.write_text(text)
            cmd = ["tool-server", "check-config", "--config", str(config)]
        log = self.scratch / f"block-{block.line}.log"
        # Output to a file, not a pipe: a background job would hold a pipe open.
        with open(log, "w") as out, open(script if kind == "python" else os.devnull) as stdin:
            proc = subprocess.Popen(
                cmd,
                cwd=self.workdir,
                env={**self.env, "PYTHONPATH": str(self.workdir)} if kind == "yaml" else self.env,
                stdin=stdin,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self._groups.append(proc.pid)
            try:
                code = proc.wait(self.timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                code = proc.wait(10)
        return BlockRun(block, code, log.read_text(errors="replace"))

    def _ensure_server(self) -> None:
        """A built-in tool server on the page's port, unless the page started one itself."""
        if answers(self.url):
            return
        cmd = ["tool-server", "serve", "--port", str(self.port)]
        self._server.enter_context(
            started(cmd, probe=lambda: answers(self.url), timeout_s=180, cwd=self.workdir, env=self.env)
        )


def _stop_group(group: int, grace_s: float = 30.0) -> None:
    """SIGTERM a block's process group (what it left in the background), SIGKILL what stays."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            os.killpg(group, 0)  # raises ProcessLookupError once the group is gone
            time.sleep(0.1)
        os.killpg(group, signal.SIGKILL)


def _repository_entries() -> set[str]:
    """The top-level names a clone has (tracked files), and the venvs `make` makes: not the
    ignored `data/` or `runs/` of this checkout, which a page's blocks would write into."""
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    return {path.split("/")[0] for path in tracked} | {
        name for name in (".venv", ".venv-vllm") if (REPO / name).exists()
    }


def run_page(doc: Path, workdir: Path) -> Iterator[BlockRun]:
    """Follow ``doc`` in ``workdir``: write its files, run its runnable blocks; yields each run."""
    with PageRunner(workdir) as runner:
        for block in blocks(doc):
            if block.file is not None:
                runner.write(block)
            if block.runnable is not None:
                yield runner.run(block)
