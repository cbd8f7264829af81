"""Trainer client: talks to the tool server over HTTP and drives multi-turn rollouts.

The names a user needs are exported here and imported on first use (module
``__getattr__``), so that ``import trainer_client`` stays cheap and never imports torch;
``GRPOTrainer`` and ``HFGenerator`` bring torch in when touched. Sub-packages: ``client``
(batched HTTP client, MCP client), ``parsers`` (tool-call formats), ``templates``
(observations rendered as token deltas, text and images), ``rollout`` (the engine-agnostic
rollout core), ``backends`` (generators: scripted, HF transformers; offline model loading),
``training`` (single-process GRPO), ``verl`` (the AgentLoop plug-in and reward bridge),
``cli`` (``trainer-client``). It imports ``protocol`` only, never ``tool_server`` or ``tools``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from protocol.moved import redirect

if TYPE_CHECKING:
    from trainer_client.backends.base import Generator, TokenOutput
    from trainer_client.backends.hf import HFGenerator
    from trainer_client.backends.models import load_model, load_tokenizer
    from trainer_client.backends.scripted import ScriptedGenerator, ScriptedTurn
    from trainer_client.client.mcp import McpToolClient
    from trainer_client.client.policies import BatchPolicy, HealthPolicy, RetryPolicy
    from trainer_client.client.sync import SyncToolClient
    from trainer_client.client.tool_client import ToolClient, ToolServerError
    from trainer_client.parsers.registry import (
        ParsedCall,
        ParseOutcome,
        ToolCallParser,
        check_call,
        get_parser,
        parser_names,
        register_parser,
    )
    from trainer_client.rollout.core import RolloutCore
    from trainer_client.rollout.types import (
        RolloutConfig,
        StopReason,
        Task,
        ToolInvoker,
        Trajectory,
        Verifier,
    )
    from trainer_client.templates.factory import make_renderer, openai_tool_schemas
    from trainer_client.training.config import GRPOConfig
    from trainer_client.training.grpo import GRPOTrainer

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
    "trainer_client.client.tool_client": ("ToolClient", "ToolServerError"),
    "trainer_client.client.policies": ("BatchPolicy", "HealthPolicy", "RetryPolicy"),
    "trainer_client.client.sync": ("SyncToolClient",),
    "trainer_client.client.mcp": ("McpToolClient",),
    "trainer_client.rollout.core": ("RolloutCore",),
    "trainer_client.rollout.types": (
        "RolloutConfig",
        "StopReason",
        "Task",
        "ToolInvoker",
        "Trajectory",
        "Verifier",
    ),
    "trainer_client.parsers.registry": (
        "ParseOutcome",
        "ParsedCall",
        "ToolCallParser",
        "check_call",
        "get_parser",
        "parser_names",
        "register_parser",
    ),
    "trainer_client.templates.factory": ("make_renderer",),
    "trainer_client.templates.tools": ("openai_tool_schemas",),
    "trainer_client.backends.base": ("Generator", "TokenOutput"),
    "trainer_client.backends.scripted": ("ScriptedGenerator", "ScriptedTurn"),
    "trainer_client.backends.hf": ("HFGenerator",),  # torch
    "trainer_client.backends.models": ("load_model", "load_tokenizer"),
    "trainer_client.training.config": ("GRPOConfig",),
    "trainer_client.training.grpo": ("GRPOTrainer",),  # torch
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


# Old module paths (before the sub-packages), importable with a DeprecationWarning.
redirect(
    {
        "trainer_client.checkpoints": "trainer_client.training.checkpoints",
        "trainer_client.client_batching": "trainer_client.client.batching",
        "trainer_client.client_dispatch": "trainer_client.client.dispatch",
        "trainer_client.client_health": "trainer_client.client.health",
        "trainer_client.client_idempotency": "trainer_client.client.idempotency",
        "trainer_client.client_policies": "trainer_client.client.policies",
        "trainer_client.client_records": "trainer_client.client.records",
        "trainer_client.client_routing": "trainer_client.client.routing",
        "trainer_client.client_splits": "trainer_client.client.splits",
        "trainer_client.config_flags": "trainer_client.cli.flags",
        "trainer_client.dataset": "trainer_client.rollout.dataset",
        "trainer_client.discovery": "trainer_client.client.discovery",
        "trainer_client.grpo": "trainer_client.training.grpo",
        "trainer_client.grpo_config": "trainer_client.training.config",
        "trainer_client.inspect_cli": "trainer_client.cli.show",
        "trainer_client.logprobs": "trainer_client.training.logprobs",
        "trainer_client.mcp_client": "trainer_client.client.mcp",
        "trainer_client.models": "trainer_client.backends.models",
        "trainer_client.observation_budget": "trainer_client.rollout.observation_budget",
        "trainer_client.observations": "trainer_client.rollout.observations",
        "trainer_client.parsers_decode": "trainer_client.parsers.decode",
        "trainer_client.parsers_formats": "trainer_client.parsers.formats",
        "trainer_client.parsers_pythonic": "trainer_client.parsers.pythonic",
        "trainer_client.parsers_tags": "trainer_client.parsers.tags",
        "trainer_client.parsers_types": "trainer_client.parsers.types",
        "trainer_client.parsers_values": "trainer_client.parsers.values",
        "trainer_client.reward_bridge": "trainer_client.verl.reward_bridge",
        "trainer_client.rollout_backends": "trainer_client.cli.generators",
        "trainer_client.rollout_cli": "trainer_client.cli.rollout",
        "trainer_client.rollout_parse": "trainer_client.rollout.parse",
        "trainer_client.rollout_runner": "trainer_client.rollout.runner",
        "trainer_client.rollout_state": "trainer_client.rollout.state",
        "trainer_client.rollout_types": "trainer_client.rollout.types",
        "trainer_client.subcommands": "trainer_client.cli.subcommands",
        "trainer_client.summary": "trainer_client.rollout.summary",
        "trainer_client.sync": "trainer_client.client.sync",
        "trainer_client.templates_codec": "trainer_client.templates.codec",
        "trainer_client.templates_tools": "trainer_client.templates.tools",
        "trainer_client.train_cli": "trainer_client.cli.train",
        "trainer_client.trajectory_records": "trainer_client.rollout.records",
        "trainer_client.user_sim": "trainer_client.rollout.user_sim",
        "trainer_client.user_turns": "trainer_client.rollout.user_turns",
        "trainer_client.verl_agent_loop": "trainer_client.verl.agent_loop",
        "trainer_client.verl_config": "trainer_client.verl.config",
        "trainer_client.vision": "trainer_client.templates.vision",
        "trainer_client.wordcache": "trainer_client.templates.wordcache",
    }
)
