"""``make_renderer``: the observation renderer for a model: its chat template (with images when
it has a processor), or a text template such as Search-R1's ``<information>`` block.
"""

from __future__ import annotations

from typing import Any

from trainer_client.templates.render import SEARCH_R1_TEMPLATE, ChatTemplateRenderer, TextTemplateRenderer
from trainer_client.templates.vision import VisionChatRenderer

__all__ = ["make_renderer"]


def make_renderer(
    tokenizer: Any,
    tool_result_template: str | None = None,
    *,
    chat_template_kwargs: dict[str, Any] | None = None,
    processor: Any = None,
    mm_processor_kwargs: dict[str, Any] | None = None,
) -> ChatTemplateRenderer | TextTemplateRenderer:
    """A chat-template renderer, or a text one when a template such as
    ``SEARCH_R1_TEMPLATE`` (or the name ``"search_r1"``) is given. With a VLM's
    ``processor``, a ``VisionChatRenderer`` (``vision``) (tool results' images as image tokens)."""
    if tool_result_template is None or tool_result_template == "chat":
        if processor is not None:
            return VisionChatRenderer(
                tokenizer,
                processor,
                chat_template_kwargs=chat_template_kwargs,
                mm_processor_kwargs=mm_processor_kwargs,
            )
        return ChatTemplateRenderer(tokenizer, chat_template_kwargs=chat_template_kwargs)
    if processor is not None:
        raise ValueError(
            "a processor (images) needs the chat-template renderer, not a text tool_result_template"
        )
    if tool_result_template == "search_r1":
        tool_result_template = SEARCH_R1_TEMPLATE
    return TextTemplateRenderer(tokenizer, tool_result_template, chat_template_kwargs=chat_template_kwargs)
