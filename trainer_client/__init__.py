"""Trainer client: talks to the tool server over HTTP and drives multi-turn rollouts.

The names a user needs are exported here and imported on first use (module
``__getattr__``), so that ``import trainer_client`` stays cheap and never imports torch;
``GRPOTrainer`` and ``HFGenerator`` bring torch in when touched. Submodules: ``client``
(batched HTTP client), ``parsers`` (tool-call formats), ``templates`` (observation
rendering as token deltas), ``rollout`` (the engine-agnostic rollout core), ``backends``
(generators: scripted, HF transformers, veRL server manager), ``models`` (offline model
loading), ``grpo`` (single-process GRPO). It imports ``protocol`` only, never
``tool_server`` or ``tools``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer_client.backends.base import Generator, TokenOutput
    from trainer_client.backends.hf import HFGenerator
    from trainer_client.backends.scripted import ScriptedGenerator, ScriptedTurn
    from trainer_client.client import ToolClient, ToolServerError
    from trainer_client.client_policies import BatchPolicy, HealthPolicy, RetryPolicy
    from trainer_client.grpo import GRPOTrainer
    from trainer_client.grpo_config import GRPOConfig
    from trainer_client.mcp_client import McpToolClient
    from trainer_client.models import load_model, load_tokenizer
    from trainer_client.parsers import (
        ParsedCall,
        ParseOutcome,
        ToolCallParser,
        check_call,
        get_parser,
        parser_names,
        register_parser,
    )
    from trainer_client.rollout import RolloutCore
    from trainer_client.rollout_types import (
        RolloutConfig,
        StopReason,
        Task,
        ToolInvoker,
        Trajectory,
        Verifier,
    )
    from trainer_client.sync import SyncToolClient
    from trainer_client.templates import make_renderer, openai_tool_schemas

__all__ = [
    "BatchPolicy",
    "GRPOConfig",
    "GRPOTrainer",
    "Generator",
    "HFGenerator",
    "HealthPolicy",
    "McpToolClient",
    "ParseOutcome",
    "ParsedCall",
    "RetryPolicy",
    "RolloutConfig",
    "RolloutCore",
    "ScriptedGenerator",
    "ScriptedTurn",
    "StopReason",
    "SyncToolClient",
    "Task",
    "TokenOutput",
    "ToolCallParser",
    "ToolClient",
    "ToolInvoker",
    "ToolServerError",
    "Trajectory",
    "Verifier",
    "check_call",
    "get_parser",
    "load_model",
    "load_tokenizer",
    "make_renderer",
    "openai_tool_schemas",
    "parser_names",
    "register_parser",
]

# Where each exported name lives; the torch-importing modules are marked.
_MODULES: dict[str, tuple[str, ...]] = {
    "trainer_client.client": ("ToolClient", "ToolServerError"),
    "trainer_client.client_policies": ("BatchPolicy", "HealthPolicy", "RetryPolicy"),
    "trainer_client.sync": ("SyncToolClient",),
    "trainer_client.mcp_client": ("McpToolClient",),
    "trainer_client.rollout": ("RolloutCore",),
    "trainer_client.rollout_types": (
        "RolloutConfig",
        "StopReason",
        "Task",
        "ToolInvoker",
        "Trajectory",
        "Verifier",
    ),
    "trainer_client.parsers": (
        "ParseOutcome",
        "ParsedCall",
        "ToolCallParser",
        "check_call",
        "get_parser",
        "parser_names",
        "register_parser",
    ),
    "trainer_client.templates": ("make_renderer", "openai_tool_schemas"),
    "trainer_client.backends.base": ("Generator", "TokenOutput"),
    "trainer_client.backends.scripted": ("ScriptedGenerator", "ScriptedTurn"),
    "trainer_client.backends.hf": ("HFGenerator",),  # torch
    "trainer_client.models": ("load_model", "load_tokenizer"),
    "trainer_client.grpo_config": ("GRPOConfig",),
    "trainer_client.grpo": ("GRPOTrainer",),  # torch
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'trainer_client' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
