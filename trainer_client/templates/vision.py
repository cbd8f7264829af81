"""Images in rollouts: tool results with image content, rendered for a vision-language model.

A tool result may hold MCP image blocks (``{"type": "image", "data": <base64>, "mimeType":
...}``). With a processor (a VLM's ``AutoProcessor``), the rollout core keeps them in the tool
message as a list of blocks and ``VisionChatRenderer`` splices the observation the way veRL's
VL continuous-token builder does: the processor's chat template renders an image placeholder
(Qwen2-VL: ``<|vision_start|><|image_pad|><|vision_end|>``) and the processor, given the
decoded images, expands each pad into as many pad tokens as the image has merged patches.
Without a processor an image becomes a line of text saying it was not shown, never nothing.

The format of image blocks in ``Trajectory.messages`` and the rollout JSONL is documented in
docs/images.md ("Images in trajectories"). Pillow is imported only when an image is decoded.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from typing import Any

import protocol
from protocol.images import image_info
from trainer_client.templates.codec import valid_utf8
from trainer_client.templates.render import ChatTemplateRenderer, Splice

__all__ = [
    "TEXT_ONLY",
    "VisionChatRenderer",
    "decode_image",
    "for_verifier",
    "has_images",
    "image_blocks",
    "not_shown",
    "observation_content",
    "training_inputs",
]

IMAGE = "image"
TEXT_ONLY = "the model reads text only"
NOT_SHOWN = "[image not shown ({what}): {why}]"
_PREFIX_CACHE_SIZE = 512  # processor-tokenized synthetic prefixes, per tool-name tuple
_FAST_CHECKS = 8  # image observations checked against the processor's own call


def image_blocks(content: Any) -> list[dict[str, Any]]:
    """The image blocks of a message's content (none for string content)."""
    if not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, dict) and b.get("type") == IMAGE]


def has_images(messages: Sequence[dict[str, Any]]) -> bool:
    return any(image_blocks(m.get("content")) for m in messages)


def not_shown(block: dict[str, Any], why: str) -> str:
    """The text that stands in for an image the model does not see."""
    try:
        info = image_info(str(block.get("data") or ""), block.get("mimeType"))
        what = f"{info.mime_type}, {info.width}x{info.height} px"
    except ValueError:  # the server checked it; a custom invoker may not have
        what = str(block.get("mimeType") or "unreadable image")
    return NOT_SHOWN.format(what=what, why=why)


def observation_content(result: protocol.Result, text: str, *, vision: bool) -> str | list[dict[str, Any]]:
    """A result as a tool message's content. ``text`` is what a text-only observation shows
    (``observations.result_text``): returned as it is when the result holds no image.

    With ``vision``: the result's text and image blocks, in order (a result whose only text is
    structured output gets it as a first text block). Without: ``text`` and one line per image
    saying it was not shown."""
    images = image_blocks(result.content)
    if not images:
        return text
    if not vision:
        return "\n".join([text] * bool(text) + [not_shown(b, TEXT_ONLY) for b in images])
    blocks = [
        dict(b, text=valid_utf8(str(b.get("text") or ""))) if b.get("type") == "text" else b
        for b in result.content
        if b.get("type") in ("text", IMAGE)
    ]
    if text and not any(b.get("type") == "text" for b in blocks):
        blocks.insert(0, {"type": "text", "text": text})
    return blocks


def for_verifier(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with each image block's ``data`` left out: verifiers read text and the
    session's world, and the views need not travel to the server again. Text-only messages
    are passed as they are (the same objects)."""
    out = []
    for m in messages:
        if image_blocks(m.get("content")):
            content = [
                {k: v for k, v in b.items() if k != "data"} if b.get("type") == IMAGE else b
                for b in m["content"]
            ]
            m = dict(m, content=content)
        out.append(m)
    return out


def decode_image(block: dict[str, Any]) -> Any:
    """An image block as an RGB Pillow image (what processors and veRL take)."""
    from PIL import Image

    try:
        image = Image.open(io.BytesIO(base64.b64decode(str(block.get("data") or ""), validate=True)))
        image.load()
    except Exception as exc:
        raise ValueError(f"an image block of a tool result cannot be decoded: {exc}") from exc
    return image.convert("RGB") if image.mode != "RGB" else image


def _placeholders(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as the chat template sees them: an image block is ``{"type": "image"}`` (the
    template writes its placeholder; the pixels go to the processor, not through Jinja)."""
    return [
        dict(m, content=[{"type": IMAGE} if b.get("type") == IMAGE else b for b in m["content"]])
        if image_blocks(m.get("content"))
        else m
        for m in messages
    ]


class VisionChatRenderer(ChatTemplateRenderer):
    """``ChatTemplateRenderer`` for a vision-language model: the processor's chat template, and
    observations with images tokenized by the processor (placeholders expanded per image).

    Observations without images take the text path unchanged (prefix cache, memo), so a
    text-only trajectory of a VLM costs what it did. ``mm_processor_kwargs`` (``min_pixels``,
    ``max_pixels``, ...) go to every processor call, as veRL's ``data.mm_processor_kwargs``
    do to its own; set them the same.
    """

    vision = True

    def __init__(
        self,
        tokenizer: Any,
        processor: Any,
        *,
        chat_template_kwargs: dict[str, Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
        memo_size: int = 1024,
    ) -> None:
        if getattr(processor, "image_processor", None) is None:
            raise ValueError(f"{type(processor).__name__} has no image_processor: it cannot render images")
        self.processor = processor
        self.mm_processor_kwargs = dict(mm_processor_kwargs or {})
        self.image_token_id = _image_token_id(processor, tokenizer)
        self._processor_prefix: dict[Any, list[int]] = {}
        self._fast_checks_left = _FAST_CHECKS  # -1: the fast count disagreed, use the processor
        self._placeholder_extra: int | None = None
        # The processor's chat template where it has one (veRL renders VL prompts with it).
        template_kwargs = dict(chat_template_kwargs or {})
        if getattr(processor, "chat_template", None):
            template_kwargs.setdefault("chat_template", processor.chat_template)
        super().__init__(tokenizer, chat_template_kwargs=template_kwargs, memo_size=memo_size)

    def render_text(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        return super().render_text(
            _placeholders(messages), add_generation_prompt=add_generation_prompt, tools=tools
        )

    def prompt_ids(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        if has_images(messages):
            raise ValueError("images in the prompt are not supported yet: only tool results may hold images")
        return super().prompt_ids(messages, tools)

    def splice(
        self,
        observations: list[dict[str, Any]],
        turn_ids: Sequence[int],
        tools: list[dict[str, Any]] | None = None,
    ) -> Splice:
        if not has_images(observations):
            return super().splice(observations, turn_ids, tools)
        entry = self._prefix(observations, tools)
        # Special-token text in the content (a turn's end, an image placeholder a tool wrote)
        # is marked, so only the template's placeholders are expanded and made tokens.
        shown, markers = self._marked(observations, entry)
        text = self.render_text(entry.messages + shown, add_generation_prompt=True, tools=tools)
        images = [decode_image(b) for m in observations for b in image_blocks(m.get("content"))]
        ids, prefix = self._tokenize(entry, text, images, markers)
        if ids[: len(prefix)] != prefix:
            raise ValueError(
                "the processor does not tokenize tool messages with images as an append-only extension"
            )
        observation_ids = ids[len(prefix) :]
        counts = self.image_token_runs(observation_ids)
        if len(counts) != len(images):
            raise ValueError(
                f"the rendered observation has {len(counts)} image token runs for {len(images)} images: "
                "the chat template must write one placeholder per image block"
            )
        return Splice(self.boundary_ids(turn_ids), observation_ids, images, counts)

    def _tokenize(
        self, entry: Any, text: str, images: list[Any], markers: dict[str, str]
    ) -> tuple[list[int], list[int]]:
        """Ids of ``text`` with its placeholders expanded for ``images``, and of the prefix;
        ``markers`` stand for special-token text in the content (``TokenCodec.encode_marked``).

        The processor's own call also computes every pixel value (12x the time of this
        path for a 768-px view: bench/client/vision_splice.py), which the splice throws away.
        So where the processor can count an image's tokens from its size
        (``_get_num_multimodal_tokens``, what vLLM uses), the pads are written into the text
        and the codec tokenizes it; the first ``_FAST_CHECKS`` observations are also run
        through the processor and must agree, else the processor is used from then on.
        The processor reads a marker as the character it is, so with markers its call gives
        the pad counts and the codec the ids."""
        fast = self._expanded(text, self._counted(images)) if self._fast_checks_left >= 0 else None
        if fast is not None and self._fast_checks_left == 0:
            return self._encode(fast, markers), entry.ids
        slow = self._processor_ids(text, images)
        if fast is not None:
            agrees = self.codec.encode(fast) == slow and entry.ids == self._processor_prefix_ids(entry)
            self._fast_checks_left = self._fast_checks_left - 1 if agrees else -1
        if markers:
            expanded = self._expanded(text, self.image_token_runs(slow))
            if expanded is None:
                raise ValueError("the processor's image token runs do not match the placeholders")
            return self.codec.encode_marked(expanded, markers), entry.ids
        return slow, self._processor_prefix_ids(entry)

    def _encode(self, text: str, markers: dict[str, str]) -> list[int]:
        return self.codec.encode_marked(text, markers) if markers else self.codec.encode(text)

    def _counted(self, images: list[Any]) -> list[int] | None:
        """Each image's token count from its size, or None where the processor cannot say."""
        counter = getattr(self.processor, "_get_num_multimodal_tokens", None)
        if counter is None:
            return None
        try:
            counted = counter(
                image_sizes=[(im.height, im.width) for im in images], **self.mm_processor_kwargs
            )
            return [int(n) for n in counted["num_image_tokens"]]
        except Exception:  # a processor whose counter takes other arguments: use the processor
            return None

    def _expanded(self, text: str, counts: list[int] | None) -> str | None:
        """``text`` with each image placeholder repeated ``counts[i]`` times, or None where
        there are no counts or they do not match the placeholders."""
        token = getattr(self.processor, "image_token", None)
        if counts is None or not isinstance(token, str):
            return None
        parts = text.split(token)
        if len(parts) != len(counts) + 1:
            return None
        return parts[0] + "".join(token * n + part for n, part in zip(counts, parts[1:], strict=True))

    def _processor_prefix_ids(self, entry: Any) -> list[int]:
        prefix = self._processor_prefix.get(entry.key)
        if prefix is None:
            if len(self._processor_prefix) >= _PREFIX_CACHE_SIZE:
                self._processor_prefix.clear()
            prefix = self._processor_prefix[entry.key] = self._processor_ids(entry.text, [])
        return prefix

    def _processor_ids(self, text: str, images: list[Any]) -> list[int]:
        out = self.processor(text=[text], images=images or None, **self.mm_processor_kwargs)
        return [int(i) for i in out["input_ids"][0]]

    def image_token_runs(self, ids: Sequence[int]) -> list[int]:
        """The length of each run of image pad tokens in ``ids``: one per image."""
        runs: list[int] = []
        previous = None
        for token in ids:
            if token == self.image_token_id:
                if previous == token:
                    runs[-1] += 1
                else:
                    runs.append(1)
            previous = token
        return runs

    @property
    def placeholder_extra(self) -> int:
        """Tokens an image's placeholder adds besides its pad tokens (Qwen2-VL: vision start
        and end), measured once from the template: an image costs ``pads + placeholder_extra``."""
        if self._placeholder_extra is None:
            with_image = [{"role": "tool", "content": [{"type": IMAGE}]}]
            without = [{"role": "tool", "content": []}]
            full = self.codec.encode(self.render_text(with_image, add_generation_prompt=False))
            bare = self.codec.encode(self.render_text(without, add_generation_prompt=False))
            self._placeholder_extra = max(0, len(full) - len(bare) - 1)
        return self._placeholder_extra


def _image_token_id(processor: Any, tokenizer: Any) -> int:
    token_id = getattr(processor, "image_token_id", None)
    if isinstance(token_id, int):
        return token_id
    token = getattr(processor, "image_token", None)
    if isinstance(token, str):
        converted = tokenizer.convert_tokens_to_ids(token)
        if isinstance(converted, int) and converted != getattr(tokenizer, "unk_token_id", None):
            return converted
    raise ValueError(f"{type(processor).__name__} names no image token (image_token / image_token_id)")


def training_inputs(
    processor: Any,
    ids: Sequence[int],
    images: Sequence[Any],
    *,
    mm_processor_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What a VLM's forward takes for one trajectory (``input_ids``, ``attention_mask``,
    ``pixel_values``, ``image_grid_thw``, ``mm_token_type_ids``), as torch tensors.

    The pixels come from the image processor alone (the ids are already expanded); the
    number of image pad tokens in ``ids`` must match what the images need, else ValueError:
    that is the invariant veRL's trainer relies on when it re-processes ``multi_modal_data``.
    """
    import torch

    image_token_id = _image_token_id(processor, processor.tokenizer)
    input_ids = torch.tensor([list(ids)], dtype=torch.long)
    inputs: dict[str, Any] = {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "mm_token_type_ids": (input_ids == image_token_id).long(),
    }
    if not images:
        return inputs
    pixels = processor.image_processor(
        images=list(images), return_tensors="pt", **(mm_processor_kwargs or {})
    )
    merge = int(getattr(processor.image_processor, "merge_size", 1))
    needed = int(pixels["image_grid_thw"].prod(dim=-1).sum()) // (merge * merge)
    present = int(inputs["mm_token_type_ids"].sum())
    if needed != present:
        raise ValueError(f"the ids hold {present} image tokens but the {len(images)} images need {needed}")
    inputs["pixel_values"] = pixels["pixel_values"]
    inputs["image_grid_thw"] = pixels["image_grid_thw"]
    return inputs
