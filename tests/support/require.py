"""``require``: import an optional dependency, or skip the tests that need it.

Every skip of something ``make setup`` (or ``make vllm``) installs goes through this module, so
that ``make test`` can turn it into a failure: a Python module (``require``), a program or
installed script (``require_program``), a data file or package (``missing``), vLLM's own
environment (``require_vllm``). tests/test_skips.py checks that no test skips such a thing itself.

A skip is right where the trainer extra was never installed (``pip install -e .[dev]``),
but under ``make test`` the extra is installed, so a missing or broken veRL means the
install is broken, and skipping would hide exactly the agreement tests that would catch
it. The Makefile's ``test`` target sets ``TOOLFACTORY_REQUIRE_TRAINER=1``: then a module
that does not import is a test failure (a collection error when called at module level).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

REQUIRE_TRAINER = os.environ.get("TOOLFACTORY_REQUIRE_TRAINER") == "1"
REQUIRE_VLLM = os.environ.get("TOOLFACTORY_REQUIRE_VLLM") == "1"


def require(module: str, reason: str | None = None) -> ModuleType:
    """The imported module; without it, a skip, or a failure under TOOLFACTORY_REQUIRE_TRAINER=1."""
    if not REQUIRE_TRAINER:
        return pytest.importorskip(module, reason=reason)
    try:
        return __import__(module, fromlist=["_"])
    except ImportError as exc:
        pytest.fail(
            f"{module} does not import ({exc}); TOOLFACTORY_REQUIRE_TRAINER=1 says the trainer extra "
            "is installed, so this is a broken install, not an optional dependency to skip",
            pytrace=False,
        )


def missing(what: str) -> NoReturn:
    """Skip: ``what`` (something ``make setup`` installs) is missing. Under
    ``TOOLFACTORY_REQUIRE_TRAINER=1`` (``make test``) fail instead: there it is a broken setup, and a
    skip would hide its tests. Called at module level it skips (or fails) the whole module."""
    if REQUIRE_TRAINER:
        pytest.fail(f"{what} is missing; `make setup` installs it", pytrace=False)
    pytest.skip(f"{what} is missing", allow_module_level=True)


def require_program(path: str, reason: str) -> None:
    """Skip unless the program at ``path`` exists (a browser, nginx, a console script of the dev
    extra); under ``TOOLFACTORY_REQUIRE_TRAINER=1`` fail instead (``missing``)."""
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        missing(f"{path} ({reason})")


def require_vllm() -> Path:
    """The python of vLLM's own environment (.venv-vllm); without it, a skip, or a failure under
    ``TOOLFACTORY_REQUIRE_VLLM=1`` (``make test``, which builds it with ``make vllm``)."""
    from trainer_client.backends.vllm_server import vllm_python

    try:
        return vllm_python()
    except FileNotFoundError as exc:
        if REQUIRE_VLLM:
            pytest.fail(f"{exc} (TOOLFACTORY_REQUIRE_VLLM=1: `make test` builds it)", pytrace=False)
        pytest.skip(f"{exc}; set TOOLFACTORY_REQUIRE_VLLM=1 to make this a failure")
