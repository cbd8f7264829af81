"""Rendering observations as token deltas that extend a trajectory.

Model tokens are never decoded and re-encoded: the trajectory grows by appending the
generated ids as they are, then the *token delta* of each observation. For chat models
the delta is what the model's own chat template adds for the tool messages: render a
fixed synthetic prefix (system, user, an assistant turn with matching tool calls), render
it again followed by the tool messages and the next generation prompt, tokenize, and keep
the part after the prefix. This is the same construction as veRL's continuous-token
builder, so the tokens agree with what veRL would produce (tests/trainer/test_verl_agreement.py).

Before the delta come the *boundary* tokens that close the assistant turn the way the
template would (ChatML: ``<|im_end|>\\n``): only the part the model did not generate
itself. A model that stopped at ``<|im_end|>`` gets ``\\n``; one stopped by a stop string
such as ``</tool_call>`` gets ``<|im_end|>\\n``. The result equals the chat template's
rendering of the whole conversation.

Observation content is data: an added-token string in it (``<|im_end|>``, ``<|eot_id|>``)
is encoded as the ordinary text it is, so a tool result cannot close its turn or open one
the model never wrote (``codec``). For any other content the ids equal the
tokenizer's on the chat template's rendering.

The prefix tokens are cached per tool-name tuple, so a turn costs one template render
and one tokenization of the observation. Tool schemas in the prompt: ``tools``.
"""

from __future__ import annotations

import logging
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import orjson

from trainer_client.templates.codec import TokenCodec, valid_utf8
from trainer_client.templates.tools import (
    FUNCTION_CALL_FORMATS,
    TOOL_SCHEMA_MODES,
    openai_tool_schemas,
    prompt_mentions_tools,
    prompt_tools,
    template_renders_tools,
    tool_names,
)

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
    "openai_tool_schemas",
    "prompt_mentions_tools",
    "prompt_tools",
    "template_renders_tools",
    "tool_names",
]

logger = logging.getLogger(__name__)

SEARCH_R1_TEMPLATE = "\n\n<information>{content}</information>\n\n"
CONTENT_FIELD = "{content}"

_SYNTHETIC_SYSTEM = {"role": "system", "content": "synthetic system turn"}
_SYNTHETIC_USER = {"role": "user", "content": "synthetic user turn"}
_PLACEHOLDER_TOOL = "tool"
_PREFIX_CACHE_SIZE = 512


@dataclass(slots=True)
class Splice:
    """Tokens appended after an assistant turn (all with loss mask 0).

    ``boundary_ids`` close the assistant turn (template tokens the model did not
    generate); ``observation_ids`` are the rendered observations, up to and including the
    next generation prompt. ``images`` are the observations' images as the processor took
    them (decoded), in placeholder order, and ``image_tokens`` the pad tokens each became
    (``vision.VisionChatRenderer``; empty for text).
    """

    boundary_ids: list[int]
    observation_ids: list[int]
    images: list[Any] = field(default_factory=list)
    image_tokens: list[int] = field(default_factory=list)

    @property
    def ids(self) -> list[int]:
        return self.boundary_ids + self.observation_ids


@runtime_checkable
class ObservationRenderer(Protocol):
    """Renders prompts and observations for one tokenizer."""

    eos_token_ids: frozenset[int]

    def prompt_ids(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]: ...

    def splice(
        self,
        observations: list[dict[str, Any]],
        turn_ids: Sequence[int],
        tools: list[dict[str, Any]] | None = None,
    ) -> Splice: ...


def _eos_ids(tokenizer: Any) -> set[int]:
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return set()
    return {int(eos)} if isinstance(eos, int) else {int(i) for i in eos}


class _RendererBase:
    """Prompt rendering (always the chat template) and the EOS ids shared by all renderers."""

    def __init__(self, tokenizer: Any, *, chat_template_kwargs: dict[str, Any] | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template; set tokenizer.chat_template first")
        self.tokenizer = tokenizer
        self.codec = TokenCodec(tokenizer)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._renders_tools: bool | None = None
        self.turn_end_ids: list[int] = self._probe_turn_end()
        eos = _eos_ids(tokenizer)
        if self.turn_end_ids and self.turn_end_ids[0] in set(getattr(tokenizer, "all_special_ids", ())):
            eos.add(self.turn_end_ids[0])
        self.eos_token_ids: frozenset[int] = frozenset(eos)

    def render_text(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            **self.chat_template_kwargs,
        )

    def prompt_ids(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """The initial prompt with the generation prompt, as veRL builds it."""
        return self.codec.encode(self.render_text(messages, add_generation_prompt=True, tools=tools))

    @property
    def renders_tools(self) -> bool:
        """Whether the chat template shows tool schemas given as ``tools=`` (computed once)."""
        if self._renders_tools is None:
            self._renders_tools = template_renders_tools(self.tokenizer, self.chat_template_kwargs)
        return self._renders_tools

    def _probe_turn_end(self) -> list[int]:
        """Tokens that close a turn (e.g. ``<|im_end|>``, ``\\n``), from two renders that
        differ only in the message body: their longest common token suffix."""
        try:
            empty = self.codec.encode(
                self.render_text([{"role": "user", "content": ""}], add_generation_prompt=False)
            )
            filled = self.codec.encode(
                self.render_text([{"role": "user", "content": "x"}], add_generation_prompt=False)
            )
        except Exception as exc:  # a template that cannot render a lone user turn
            logger.warning("could not probe the turn-closing tokens of the chat template: %s", exc)
            return []
        n = 0
        while n < min(len(empty), len(filled)) and empty[-1 - n] == filled[-1 - n]:
            n += 1
        return empty[len(empty) - n :] if n else []

    def boundary_ids(self, turn_ids: Sequence[int]) -> list[int]:
        """The part of the turn-closing tokens the model has not generated itself."""
        close = self.turn_end_ids
        for k in range(min(len(close), len(turn_ids)), 0, -1):
            if list(turn_ids[-k:]) == close[:k]:
                return close[k:]
        return list(close)


@dataclass(slots=True)
class _Prefix:
    """A rendered synthetic prefix; ``split_ok`` records whether suffix-only tokenization
    was verified (None: not yet checked)."""

    key: tuple[Any, ...]
    messages: list[dict[str, Any]]
    text: str
    ids: list[int]
    split_ok: bool | None = None


class ChatTemplateRenderer(_RendererBase):
    """Observations as ``tool``-role messages rendered by the model's chat template.

    ``memo_size`` bounds a cache of rendered observation deltas: identical observations
    (the same documents retrieved for the same query by the samples of one prompt) are
    tokenized once. 0 disables it.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        chat_template_kwargs: dict[str, Any] | None = None,
        memo_size: int = 1024,
    ) -> None:
        super().__init__(tokenizer, chat_template_kwargs=chat_template_kwargs)
        self._prefix_cache: dict[tuple[Any, ...], _Prefix] = {}
        self._memo: OrderedDict[tuple[Any, ...], array[int]] = OrderedDict()
        self._memo_size = memo_size
        # Special tokens that never absorb whitespace before them: a safe place to split text.
        decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        self._split_tokens = tuple(
            t.content
            for t in decoder.values()
            if getattr(t, "special", False) and not getattr(t, "lstrip", False)
        )

    def splice(
        self,
        observations: list[dict[str, Any]],
        turn_ids: Sequence[int],
        tools: list[dict[str, Any]] | None = None,
    ) -> Splice:
        return Splice(self.boundary_ids(turn_ids), self.observation_ids(observations, tools))

    def observation_ids(
        self, observations: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """Token delta of ``observations`` (tool messages) plus the next generation prompt."""
        if not observations:
            raise ValueError("observation_ids needs at least one message")
        try:
            return self._delta(observations, add_generation_prompt=True, tools=tools)
        except Exception:
            if len(observations) == 1:
                raise
        # Some templates (Llama 3.1) refuse several tool calls in one assistant turn:
        # render one tool message at a time.
        ids: list[int] = []
        for i, message in enumerate(observations):
            last = i == len(observations) - 1
            ids += self._delta([message], add_generation_prompt=last, tools=tools)
        return ids

    def _delta(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool, tools: Any) -> list[int]:
        messages = [_with_texts(m, valid_utf8) for m in messages]
        entry = self._prefix(messages, tools)
        memo_key = None
        if self._memo_size:
            memo_key = (entry.key, add_generation_prompt, orjson.dumps(messages, default=str))
            hit = self._memo.get(memo_key)
            if hit is not None:
                self._memo.move_to_end(memo_key)
                return hit.tolist()
        shown, markers = self._marked(messages, entry)
        text = self.render_text(
            entry.messages + shown, add_generation_prompt=add_generation_prompt, tools=tools
        )
        ids = self._suffix_ids(entry, text, messages, markers)
        if memo_key is not None:
            self._memo[memo_key] = array("l", ids)
            if len(self._memo) > self._memo_size:
                self._memo.popitem(last=False)
        return ids

    def _marked(
        self, messages: list[dict[str, Any]], entry: _Prefix
    ) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """``messages`` with the added-token strings of their content replaced by markers
        (``TokenCodec.literal_markers``), and the markers; the messages themselves when
        none holds one."""
        markers = self.codec.literal_markers(
            (t for m in messages for t in _content_texts(m.get("content"))),
            avoid=(entry.text, str(self.tokenizer.chat_template), str(self.chat_template_kwargs)),
        )
        if not markers:
            return messages, markers
        return [_with_texts(m, lambda t: self.codec.mark(t, markers)) for m in messages], markers

    def _suffix_ids(
        self, entry: _Prefix, text: str, messages: list[dict[str, Any]], markers: dict[str, str]
    ) -> list[int]:
        """Tokens of ``text`` after the prefix tokens; ``markers`` (``TokenCodec.literal_markers``)
        stand for special-token text in the content.

        Tokenizing only the text after the prefix gives the same ids when the suffix
        starts with a special token (the tokenizer splits there first); that is checked
        against the full tokenization the first time a prefix is used.
        """

        def encode(part: str) -> list[int]:
            return self.codec.encode_marked(part, markers) if markers else self.codec.encode(part)

        if entry.split_ok is not False and text.startswith(entry.text):
            tail = text[len(entry.text) :]
            if entry.split_ok:
                return encode(tail)
            if any(tail.startswith(t) for t in self._split_tokens):
                fast = encode(tail)
                full = encode(text)
                entry.split_ok = full == entry.ids + fast
                if entry.split_ok:
                    return fast
            else:
                entry.split_ok = False
        full = encode(text)
        if full[: len(entry.ids)] != entry.ids:
            roles = [m.get("role") for m in messages]
            raise ValueError(
                f"the chat template does not render {roles} as an append-only extension of the conversation; "
                "observations cannot be spliced as a token delta with this template"
            )
        return full[len(entry.ids) :]

    def _prefix(self, messages: list[dict[str, Any]], tools: Any) -> _Prefix:
        key = (
            tuple((m.get("name"), m.get("tool_call_id")) for m in messages),
            orjson.dumps(tools, option=orjson.OPT_SORT_KEYS) if tools else None,
        )
        cached = self._prefix_cache.get(key)
        if cached is not None:
            return cached
        tool_calls = [
            {
                "id": m.get("tool_call_id") or f"call_{i}",
                "type": "function",
                "function": {"name": m.get("name") or _PLACEHOLDER_TOOL, "arguments": {}},
            }
            for i, m in enumerate(messages)
        ]
        prefix_messages = [
            _SYNTHETIC_SYSTEM,
            _SYNTHETIC_USER,
            {"role": "assistant", "content": "", "tool_calls": tool_calls},
        ]
        text = self.render_text(prefix_messages, add_generation_prompt=False, tools=tools)
        entry = _Prefix(key, prefix_messages, text, self.codec.encode(text))
        if len(self._prefix_cache) >= _PREFIX_CACHE_SIZE:
            self._prefix_cache.clear()
        self._prefix_cache[key] = entry
        return entry


class TextTemplateRenderer(_RendererBase):
    """Observations as plain text inside the assistant turn (Search-R1's ``<information>``).

    The model's turn is not closed: the observation text is tokenized on its own and the
    model continues right after it.
    """

    def __init__(
        self,
        tokenizer: Any,
        template: str = SEARCH_R1_TEMPLATE,
        *,
        joiner: str = "\n",
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if CONTENT_FIELD not in template:
            raise ValueError(f"the observation template must contain {CONTENT_FIELD}, got {template!r}")
        super().__init__(tokenizer, chat_template_kwargs=chat_template_kwargs)
        self.template = template
        self.joiner = joiner

    def splice(
        self,
        observations: list[dict[str, Any]],
        turn_ids: Sequence[int],
        tools: list[dict[str, Any]] | None = None,
    ) -> Splice:
        content = valid_utf8(self.joiner.join(str(m.get("content") or "") for m in observations))
        markers = self.codec.literal_markers([content], avoid=[self.template])
        text = self.template.replace(CONTENT_FIELD, self.codec.mark(content, markers))
        return Splice([], self.codec.encode_marked(text, markers) if markers else self.codec.encode(text))


def _content_texts(content: Any) -> list[str]:
    """The texts of a message's content: a string, or its text blocks' texts."""
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)]
    return []


def _with_texts(message: dict[str, Any], change: Callable[[str], str]) -> dict[str, Any]:
    """``message`` with ``change`` applied to the texts of its content (a string, or text
    blocks); the message itself when no text changes."""
    content = message.get("content")
    if isinstance(content, str):
        changed = change(content)
        return message if changed == content else dict(message, content=changed)
    if isinstance(content, list):
        blocks = [
            dict(b, text=change(b["text"])) if isinstance(b, dict) and isinstance(b.get("text"), str) else b
            for b in content
        ]
        return message if blocks == content else dict(message, content=blocks)
    return message
