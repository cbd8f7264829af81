"""Tool-call formats: one assistant turn's text into calls, errors and a final answer.

A parser never raises on model output and reads it in linear time; a malformed call becomes
an error observation the model can learn from.

* ``registry``: ``get_parser``, ``register_parser``, ``parser_names``;
* ``formats``: hermes/Qwen ``<tool_call>``, Search-R1 tags, Llama 3 JSON;
* ``pythonic``: ``[f(a=1), g(b=2)]`` calls (Llama 3.2/4 style);
* ``tags``: tags found in one pass; ``decode``: model text as data (nothing is run);
* ``values``: ``check_call``, a call fit to travel as JSON; ``types``: what a parser returns.
"""

from trainer_client.parsers.registry import (
    MAX_NESTING,
    HermesParser,
    Llama3JsonParser,
    ParsedCall,
    ParseOutcome,
    PythonicParser,
    SearchR1Parser,
    ToolCallParser,
    Tools,
    check_call,
    find_answer,
    get_parser,
    parser_names,
    register_parser,
    tool_parameters,
)

__all__ = [
    "MAX_NESTING",
    "HermesParser",
    "Llama3JsonParser",
    "ParseOutcome",
    "ParsedCall",
    "PythonicParser",
    "SearchR1Parser",
    "ToolCallParser",
    "Tools",
    "check_call",
    "find_answer",
    "get_parser",
    "parser_names",
    "register_parser",
    "tool_parameters",
]
