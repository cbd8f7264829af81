"""Observations as token deltas: a tool result rendered with the model's chat template and
appended to the trajectory token for token (text and images).

* ``factory``: ``make_renderer``, the renderer for a model (chat, text or vision);
* ``render``: the chat- and text-template renderers, ``Splice``;
* ``codec``: ``TokenCodec``, text ↔ ids, and text that must stay text (no forged turns);
* ``tools``: MCP descriptors as chat-template tool schemas in the prompt;
* ``vision``: image results for vision-language models (pad tokens, pixel values);
* ``wordcache``: a word-level cache in front of byte-level BPE tokenizers.
"""

from trainer_client.templates.codec import TokenCodec
from trainer_client.templates.factory import make_renderer
from trainer_client.templates.render import (
    CONTENT_FIELD,
    FUNCTION_CALL_FORMATS,
    SEARCH_R1_TEMPLATE,
    TOOL_SCHEMA_MODES,
    ChatTemplateRenderer,
    ObservationRenderer,
    Splice,
    TextTemplateRenderer,
    prompt_mentions_tools,
    prompt_tools,
    template_renders_tools,
    tool_names,
)
from trainer_client.templates.tools import openai_tool_schemas

__all__ = [
    "CONTENT_FIELD",
    "FUNCTION_CALL_FORMATS",
    "SEARCH_R1_TEMPLATE",
    "TOOL_SCHEMA_MODES",
    "ChatTemplateRenderer",
    "ObservationRenderer",
    "Splice",
    "TextTemplateRenderer",
    "TokenCodec",
    "make_renderer",
    "openai_tool_schemas",
    "prompt_mentions_tools",
    "prompt_tools",
    "template_renders_tools",
    "tool_names",
]
