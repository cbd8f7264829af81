"""The container image, the Makefile, the README and .gitignore say the same about what is
installed and what the documented commands write (issue 27, point 8)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = (REPO / "compose" / "Dockerfile").read_text()
MAKEFILE = (REPO / "Makefile").read_text()


def run_lines() -> list[str]:
    """The Dockerfile's RUN instructions, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    return [line[4:] for line in joined.splitlines() if line.startswith("RUN ")]


def pip_installs() -> list[list[str]]:
    """The arguments of every `pip install` in the Dockerfile."""
    commands = [part.strip() for line in run_lines() for part in line.split("&&")]
    return [shlex.split(c)[2:] for c in commands if c.startswith("pip install")]


def make_variable(name: str) -> list[str]:
    match = re.search(rf"^{name} := (.*)$", MAKEFILE, re.MULTILINE)
    assert match, name
    return match.group(1).split()


def test_every_script_the_image_installs_has_its_package_in_the_image() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    copied = set(re.findall(r"^COPY (\w+) \./\1$", DOCKERFILE, re.MULTILINE))
    assert {"protocol", "tool_server", "tools"} <= copied
    for script, target in scripts.items():
        package = target.split(".")[0].split(":")[0]
        if package not in copied:  # pip installs the script anyway: the image must remove it
            removed = any(re.search(rf"\brm\b[^&]*\b{re.escape(script)}\b", line) for line in run_lines())
            assert removed, f"the image installs the {script} script, but not {package}"


def test_the_image_installs_the_versions_make_setup_installs() -> None:
    assert re.search(r"^COPY [^\n]*\bconstraints\.txt\b", DOCKERFILE, re.MULTILINE)
    data_pins = dict(p.split("==") for p in make_variable("DATA_PACKAGES"))
    installs = pip_installs()
    assert installs
    for arguments in installs:
        assert "-c" in arguments and arguments[arguments.index("-c") + 1] == "constraints.txt", arguments
        flag_values = {arguments[i + 1] for i, a in enumerate(arguments) if a in ("-c", "-r")}
        for requirement in (a for a in arguments if not a.startswith("-") and a not in flag_values | {"."}):
            name, _, version = requirement.partition("==")
            assert version, f"{name} is installed without a version"
            assert data_pins.get(name) == version, (
                f"{requirement}: the Makefile installs {data_pins.get(name)}"
            )


def test_the_readme_names_the_extras_make_setup_installs() -> None:
    match = re.search(r'-e "\.\[([a-z,]+)\]"', MAKEFILE)
    assert match
    setup_paragraph = (REPO / "README.md").read_text().split("**toolfactory**")[0]
    for extra in match.group(1).split(","):
        assert f"`{extra}`" in setup_paragraph, (
            f"the README does not say make setup installs the {extra} extra"
        )
    for package in make_variable("NODEPS_PACKAGES"):
        assert f"`{package.split('==')[0]}`" in setup_paragraph


@pytest.mark.skipif(
    shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs a git checkout"
)
def test_what_the_documented_commands_write_is_ignored() -> None:
    paths = [
        "data/search_qa/train.parquet",
        ".schemathesis/report.json",
        "tools/data/new.py",
        "tests/data/x.py",
    ]
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", *paths], cwd=REPO, capture_output=True, text=True, timeout=60
    ).stdout.split()
    assert ignored == ["data/search_qa/train.parquet", ".schemathesis/report.json"]
