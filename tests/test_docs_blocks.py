"""The README and docs/ work as written: their runnable blocks run, their files are files.

A block marked ``<!-- runnable -->`` runs in page order in a scratch copy of the repository
root, with the venv on PATH and real servers (tests/support/docs_blocks.py says how). The
other blocks are not run, on purpose: ``make`` targets (the whole suite, installs), Docker and
Kubernetes, GPU recipes, a real model's rollout (minutes of CPU), and snippets with
placeholders; the README's "Tests and benchmarks" lists them.
"""

from __future__ import annotations

import glob
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.docs_blocks import DOCS, REPO, Block, DocsMarkupError, blocks, run_page

RUNNABLE_DOCS = [doc for doc in DOCS if any(b.runnable is not None for b in blocks(doc))]
# Pages whose repository paths must exist: the docs, and the READMEs next to the recipes and benchmarks.
CITING_DOCS = [*DOCS, REPO / "examples" / "README.md", REPO / "bench" / "README.md"]
# Formats in which the `# file: NAME` first line is a comment, so a copied block is still the file.
HASH_COMMENTS = {".py", ".yaml", ".yml", ".sh", ".toml"}
# Paths in other projects that the docs quote (NeMo Gym's docs, in docs/scaling.md).
ELSEWHERE = {"docs/about/performance.md", "docs/infrastructure/aiohttp-vs-httpx.md"}


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("doc", RUNNABLE_DOCS, ids=lambda d: str(d.relative_to(REPO)))
def test_runnable_blocks_run_as_written(doc: Path, tmp_path: Path) -> None:
    failures = [why for run in run_page(doc, tmp_path) if (why := run.failure()) is not None]
    assert not failures, "\n\n".join(failures)


def test_the_readme_has_runnable_blocks() -> None:
    """The runner is not idle: the README's own first steps are among what it runs."""
    runnable = [b for b in blocks(REPO / "README.md") if b.runnable is not None]
    assert len(runnable) >= 4, [b.where for b in runnable]


def test_file_blocks_are_the_files_as_shown() -> None:
    """A reader copies a block into the file it names: what the block shows must be that file."""
    problems = []
    for doc in DOCS:
        for block in (b for b in blocks(doc) if b.file is not None):
            if problem := _not_a_valid_file(block):
                problems.append(f"{block.where} ({block.file}): {problem}")
    assert not problems, "\n".join(problems)


def _not_a_valid_file(block: Block) -> str | None:
    suffix = Path(block.file or "").suffix
    if block.body.startswith("# file: ") and suffix not in HASH_COMMENTS:
        return f"a {suffix} file has no `#` comments: name it with `<!-- file: {block.file} -->` before the block"
    try:
        if suffix == ".json":
            json.loads(block.body)  # the whole block: JSON has no comment line to name the file
        elif suffix == ".jsonl":
            for line in block.body.splitlines():
                if line.strip():
                    json.loads(line)
        elif suffix in (".yaml", ".yml"):
            yaml.safe_load(block.body)
        elif suffix == ".py":
            compile(block.body, block.file or "<block>", "exec")
    except (ValueError, yaml.YAMLError, SyntaxError) as exc:
        return f"not a valid {suffix} file as shown: {exc}"
    return None


def test_blocks_use_one_command_form() -> None:
    """Commands are written for an activated venv (`tool-server`, not `.venv/bin/tool-server`)."""
    found = [
        f"{block.where}: {line.strip()}"
        for doc in DOCS
        for block in blocks(doc)
        for line in block.body.splitlines()
        if re.search(r"\.venv/bin/(?!activate\b)", line)
    ]
    assert not found, "say `source .venv/bin/activate` once instead:\n" + "\n".join(found)


def test_the_docs_say_how_to_get_the_commands_on_path() -> None:
    readme = (REPO / "README.md").read_text()
    assert "source .venv/bin/activate" in readme.split("\n## ", 1)[0]  # before the first section


def test_markers_are_well_formed(tmp_path: Path) -> None:
    """Every doc parses; a marker that names no block, an unknown option or language is an error."""
    for doc in DOCS:
        blocks(doc)
    cases = {
        "<!-- runnable: sever -->\n```bash\ntrue\n```\n": "unknown runnable option 'sever'",
        "<!-- runnable -->\n```text\nhello\n```\n": "must be one of",
        "<!-- runnable -->\n\n```bash\ntrue\n```\n": "precedes no code block",
        "<!-- file: a.json -->\n```json\n# file: a.json\n{}\n```\n": "write the file name once",
    }
    for text, message in cases.items():
        page = tmp_path / "page.md"
        page.write_text(text)
        with pytest.raises(DocsMarkupError, match=re.escape(message)):
            blocks(page)


def test_the_runner_reports_failures_and_stops_what_a_page_started(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- file: data/n.json -->\n```json\n[1, 2]\n```\n\n"
        '<!-- runnable: expect="3" -->\n```python\nimport json\nprint(sum(json.load(open("data/n.json"))))\n```\n\n'
        "<!-- runnable -->\n```bash\nsleep 600 &\necho $! > sleeper.pid\n```\n\n"
        "<!-- runnable -->\n```bash\nfalse\necho not reached\n```\n\n"
        '<!-- runnable: expect="4" -->\n```bash\necho 3\n```\n'
    )
    work = tmp_path / "work"
    work.mkdir()
    runs = list(run_page(page, work))
    assert [run.failure() is None for run in runs] == [True, True, False, False]
    assert "exited 1" in (runs[2].failure() or "") and "not reached" not in runs[2].output
    assert "printed nothing that matches '4'" in (runs[3].failure() or "")
    sleeper = int((work / "sleeper.pid").read_text())
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(sleeper)], capture_output=True, text=True)
    assert state.stdout.strip() in ("", "Z"), "the page's background job outlived the page"


def test_cited_repository_files_exist() -> None:
    """A path the docs cite (`tests/...`, `examples/...`, FACTS.md) is one a user has."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    tops = {path.split("/")[0] for path in listed if "/" in path}
    names = {path.rsplit("/", 1)[-1] for path in listed}
    path_like = re.compile(
        r"(?<![\w./-])([\w.-]+(?:/[\w.*{},-]+)*\.(?:md|py|ya?ml|sh|json|jsonl|png|toml|txt))(?![\w/-])"
    )
    missing = []
    for doc in CITING_DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            for token in path_like.findall(line):
                for cited in _expand_braces(token):
                    if "/" in cited:  # a repository path: its first folder is one of ours
                        if cited in ELSEWHERE or cited.split("/")[0] not in tops:
                            continue
                        if not glob.glob(str(REPO / cited)):
                            missing.append(f"{doc.relative_to(REPO)}:{number}: {cited}")
                    elif re.fullmatch(r"[A-Z][A-Z_]*\.md", cited) and cited not in names:
                        missing.append(f"{doc.relative_to(REPO)}:{number}: {cited}")  # project notes
    assert not missing, "cited but not in the repository:\n" + "\n".join(missing)


def _expand_braces(token: str) -> list[str]:
    """``learn_arithmetic.{png,json}`` -> both names."""
    match = re.search(r"\{([^{}]*)\}", token)
    if match is None:
        return [token]
    return [
        expanded
        for choice in match.group(1).split(",")
        for expanded in _expand_braces(token[: match.start()] + choice + token[match.end() :])
    ]
