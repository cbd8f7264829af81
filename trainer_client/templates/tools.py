"""Tool schemas in the prompt: MCP descriptors as chat-template schemas, and which schemas
a task shows the model (``prompt_tools``, ``--tool-schemas``)."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

__all__ = [
    "FUNCTION_CALL_FORMATS",
    "TOOL_SCHEMA_MODES",
    "openai_tool_schemas",
    "prompt_mentions_tools",
    "prompt_tools",
    "template_renders_tools",
    "tool_names",
]

logger = logging.getLogger(__name__)

# Where the tool schemas shown in the prompt come from (``--tool-schemas``):
# "auto" the server's, when the template renders them and the prompt does not already
# describe the tools; "server" the server's, always; "none" never. A dataset's own
# ``extra_info["tools"]`` are used in every mode but "none".
TOOL_SCHEMA_MODES = ("auto", "server", "none")

# Formats whose calls are function calls, as a template's tool block tells the model to
# write them; Search-R1's <search> tags are not, so "auto" shows no schemas for them.
FUNCTION_CALL_FORMATS = frozenset({"hermes", "qwen", "llama3_json", "pythonic"})

_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "toolfactory_probe_tool",
        "description": "probe",
        "parameters": {"type": "object", "properties": {}},
    },
}


def openai_tool_schemas(descriptors: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """MCP tool descriptors (``/v1/tools``) -> the ``{"type": "function", ...}`` schemas chat
    templates expect. Schemas already in that form pass through."""
    schemas = []
    for d in descriptors:
        if d.get("type") == "function" or "name" not in d:  # already a template schema
            schemas.append(d)
            continue
        schemas.append(
            {
                "type": "function",
                "function": {
                    "name": d["name"],
                    "description": d.get("description") or "",
                    "parameters": d.get("inputSchema") or {"type": "object", "properties": {}},
                },
            }
        )
    return schemas


def template_renders_tools(tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None) -> bool:
    """Whether ``apply_chat_template(..., tools=[...])`` puts the tools in the prompt.

    SmolLM2's template ignores ``tools``; Qwen's and Llama 3.1's render them.
    """
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "x"}],
            tokenize=False,
            add_generation_prompt=True,
            tools=[_PROBE_TOOL],
            **(chat_template_kwargs or {}),
        )
    except Exception as exc:  # a template that cannot take tools at all
        logger.info("the chat template does not render tools: %s", exc)
        return False
    return _PROBE_TOOL["function"]["name"] in text


def tool_names(tools: Sequence[dict[str, Any]]) -> list[str]:
    names = []
    for tool in tools:
        spec = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        if isinstance(spec.get("name"), str):
            names.append(spec["name"])
    return names


def prompt_mentions_tools(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> bool:
    """Whether the prompt already names one of the tools (an inline tool description)."""
    text = "\n".join(str(m.get("content") or "") for m in messages)
    return any(re.search(rf"\b{re.escape(name)}\b", text) for name in tool_names(tools))


def prompt_tools(
    mode: str,
    *,
    messages: Sequence[dict[str, Any]],
    dataset_tools: list[dict[str, Any]] | None,
    server_tools: list[dict[str, Any]] | None,
    renders_tools: bool,
    format: str,
) -> list[dict[str, Any]] | None:
    """The tool schemas one task shows the model through the chat template (see
    ``TOOL_SCHEMA_MODES``); None shows none.

    "auto" leaves a prompt that already describes its tools as it is (the built-in
    datasets and the few-shot prompts the demo and the examples rely on), so it changes
    what the model sees only where it would otherwise see no tools at all.
    """
    if mode not in TOOL_SCHEMA_MODES:
        raise ValueError(f"tool schema mode must be one of {', '.join(TOOL_SCHEMA_MODES)}, got {mode!r}")
    if mode == "none":
        return None
    if dataset_tools:
        return openai_tool_schemas(dataset_tools)
    if not server_tools:
        return None
    if mode == "server":
        return server_tools
    if (
        renders_tools
        and format in FUNCTION_CALL_FORMATS
        and not prompt_mentions_tools(messages, server_tools)
    ):
        return server_tools
    return None
