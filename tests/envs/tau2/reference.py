"""τ²'s own environments for the parity checks, thousands of them at the cost of a few.

Each is τ²'s ``get_environment`` of the domain (what its registry constructs, telecom's manual
policy), called with the DBs passed in instead of read by it. Two costs that do not depend on
the task leave the per-environment path:

- τ²'s ``get_environment()`` reads the domain's DB files on every call (``DB.load``: the file
  parsed, then validated into the DB model; telecom's two TOML files take ~20 ms to parse).
  Here each file is parsed once per process and each environment validates its own copy of
  the parsed data, as ``DB.load`` does (a copy of a validated model is no cheaper: pydantic
  unpickles airline's DB slower than it validates it).
- In solo mode τ² checks that no tool is both the agent's and the customer's by building every
  tool's schema (``validate_solo_mode``, ~0.1 s a call). That is a check of the toolkit
  classes, not of a task: it runs on the first solo environment of a domain only.
"""

from __future__ import annotations

import functools
import pickle
from typing import Any
from unittest import mock

from tools.envs.tau2.domain import import_tau2, load_domain

_SOLO_CHECKED: set[str] = set()


@functools.cache
def _parsed(path: str) -> bytes:
    return pickle.dumps(import_tau2("tau2.utils").load_file(path))  # what DB.load parses


def fresh_db(db_class: type, path: str) -> Any:
    """``db_class.load(path)``: the file's data validated into a model no other caller holds."""
    return db_class.model_validate(pickle.loads(_parsed(str(path))))  # type: ignore[attr-defined]  # noqa: S301


def environment(domain: str, solo_mode: bool = False) -> Any:
    """τ²'s ``get_environment(solo_mode=...)`` of ``domain`` over fresh copies of its package's DBs."""
    source = load_domain(domain)
    module = source.environment
    prefix = domain.upper()
    dbs = {"db": fresh_db(source.db_class, getattr(module, f"{prefix}_DB_PATH"))}
    if source.user_db_class is not None:
        dbs["user_db"] = fresh_db(source.user_db_class, getattr(module, f"{prefix}_USER_DB_PATH"))
    if not solo_mode or domain not in _SOLO_CHECKED:
        env = module.get_environment(solo_mode=solo_mode, **dbs)
        if solo_mode:
            _SOLO_CHECKED.add(domain)
        return env
    base = import_tau2("tau2.environment.environment").Environment  # no domain overrides the check
    with mock.patch.object(base, "validate_solo_mode", lambda self: None):
        return module.get_environment(solo_mode=True, **dbs)
