"""Modules that moved into sub-packages still import under their old paths, with a warning.

Users' configs name tools by ``module:attribute`` and veRL configs name the agent loop by
module; those keep working for a deprecation period (``protocol.moved``).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
import warnings

import pytest

from protocol import moved
from protocol.moved import current_name
from tool_server.config import DEFAULT_CONFIG_PATH, _merge, _read_yaml, config_from_dict
from tool_server.registry import import_target

OLD_AND_NEW = [
    ("tools.dense_search", "tools.search.dense"),
    ("tools.sandbox_pool", "tools.sandbox.pool"),
    ("tools.envs.tau2_domain", "tools.envs.tau2.domain"),
    ("tool_server.http_api", "tool_server.api.routes"),
    ("tool_server.upstream_server", "tool_server.upstream.server"),
    ("trainer_client.reward_bridge", "trainer_client.verl.reward_bridge"),
    ("trainer_client.parsers_formats", "trainer_client.parsers.formats"),
]


@pytest.mark.parametrize(("old", "new"), OLD_AND_NEW)
def test_an_old_path_imports_the_new_module_and_warns(old: str, new: str) -> None:
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"module {old} moved to {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)  # one module object: one state, not a copy
    assert current_name(old) == new


def test_an_old_tool_target_still_loads() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = import_target("tools.dense_search:DenseSearchTool")
    assert old is import_target("tools.search.dense:DenseSearchTool")
    assert import_target("tools.search:SearchTool") is import_target("tools.search.bm25:SearchTool")


def test_a_config_naming_a_builtin_by_its_old_path_updates_it() -> None:
    """``extends: builtin`` plus an entry with the old target changes the built-in entry, not a second one."""
    builtin = _read_yaml(DEFAULT_CONFIG_PATH)
    before = [t for t in builtin["tools"] if "DenseSearch" in t["target"]]
    assert len(before) == 1
    merged = _merge(builtin, {"tools": [{"target": "tools.dense_search:DenseSearchTool", "enabled": False}]})
    dense = [t for t in merged["tools"] if "DenseSearch" in t["target"]]
    assert len(dense) == 1 and dense[0]["enabled"] is False
    assert config_from_dict(merged, environ={}).tools  # and the merged config is valid


def test_every_old_path_points_at_a_module_that_exists() -> None:
    assert len(moved._MOVED) > 50
    missing = [
        f"{old} -> {new}" for old, new in moved._MOVED.items() if importlib.util.find_spec(new) is None
    ]
    assert not missing


def test_the_verl_plugin_entry_point_names_the_new_module() -> None:
    (entry,) = [e for e in importlib.metadata.entry_points(group="verl.plugins") if e.name == "toolfactory"]
    assert entry.value == "trainer_client.verl.agent_loop"
    assert importlib.util.find_spec(entry.value) is not None
