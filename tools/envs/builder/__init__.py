"""Build an environment pack from a scenario with a model: the five stages of FTRL's pipeline.

Scenario decomposition, document generation, function integration, complexity scaling
and localized deployment (Ye et al. 2025, "Feedback-Driven Tool-Use Improvements in Large
Language Models via Automated Build Environments"), each an OpenAI-compatible chat call
whose JSON answer is validated and retried (``stages``), then a deterministic gate
(``gate``) and a pack on disk whose generated code only ever runs in the sandbox
(``loader``, ``sandboxed``). Entry points: ``build`` and the ``env build`` command (``cli``).
"""

import importlib
from typing import Any

__all__ = ["BuildConfig", "ChatModel", "SandboxExecutor", "build", "load_built_pack"]

# Loaded on first use: `tool-server --help` imports the `env build` command, which must not
# pull in the pipeline (httpx, jsonschema, the sandbox).
_WHERE = {
    "BuildConfig": "pipeline",
    "build": "pipeline",
    "ChatModel": "llm",
    "load_built_pack": "loader",
    "SandboxExecutor": "sandboxed",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'tools.envs.builder' has no attribute {name!r}")
    return getattr(importlib.import_module(f"tools.envs.builder.{module}"), name)
