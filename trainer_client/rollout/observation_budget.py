"""Fitting one turn's observations to ``RolloutConfig.max_obs_tokens``.

Content tokens count (template tokens do not), image tokens included. An image is whole
or not shown: images are kept in order while their tokens fit, each one that does not is
replaced by a line saying so (``vision.not_shown``). The text shares what is left by
water-filling (``share``): short results stay whole, long ones are cut and end with the
truncation marker, which comes on top of the budget.
"""

from __future__ import annotations

from typing import Any

from trainer_client.rollout.types import RolloutConfig
from trainer_client.templates.render import ObservationRenderer, Splice
from trainer_client.templates.vision import image_blocks, not_shown

__all__ = ["ObservationBudget", "content_text", "share", "with_content"]


class ObservationBudget:
    """Renders a turn's observations as a splice within ``max_obs_tokens``.

    ``codec`` encodes and decodes text without special tokens; the config gives the
    budget and the truncation marker (``{n}``: the tokens cut)."""

    def __init__(self, renderer: ObservationRenderer, codec: Any, config: RolloutConfig) -> None:
        self.renderer = renderer
        self.codec = codec
        self.config = config

    def splice(
        self,
        observations: list[dict[str, Any]],
        turn_ids: list[int],
        tools: Any,
        metrics: dict[str, Any],
    ) -> Splice:
        """The splice for ``observations``, their content cut to about ``max_obs_tokens``.

        Cut observations replace theirs in ``observations`` (in place), so that the
        messages record what the model saw; ``metrics`` counts the cuts."""
        budget = self.config.max_obs_tokens
        splice = self.renderer.splice(observations, turn_ids, tools)
        if len(splice.observation_ids) <= budget:
            return splice
        empty = [dict(o, content="") for o in observations]  # memoized by the renderer after the first turn
        overhead = len(self.renderer.splice(empty, turn_ids, tools).observation_ids)
        if len(splice.observation_ids) - overhead <= budget:
            return splice
        # Over budget: short results stay whole, long ones share the rest and end with a marker.
        metrics["truncated_observations"] += 1
        blocks = [b for o in observations for b in image_blocks(o.get("content"))]
        notes = self._fit_images(splice, blocks, budget) if splice.images else {}
        if notes:
            metrics["images_not_shown"] = metrics.get("images_not_shown", 0) + len(notes)
        kept = sum(
            c + self.renderer.placeholder_extra for i, c in enumerate(splice.image_tokens) if i not in notes
        )
        text_budget = max(0, budget - kept - sum(len(self.codec.encode(n)) for n in notes.values()))
        # Content is spliced as data (special-token text as ordinary text): count it so.
        encode = getattr(self.codec, "encode_text", self.codec.encode)
        content_ids = [encode(content_text(o.get("content"))) for o in observations]
        limits = share(text_budget, [len(ids) for ids in content_ids])
        first_image = 0
        for k, (o, ids, limit) in enumerate(zip(observations, content_ids, limits, strict=True)):
            cut = None if limit is None else self._cut(ids, limit)
            count = len(image_blocks(o.get("content")))
            mine = {i - first_image: n for i, n in notes.items() if first_image <= i < first_image + count}
            observations[k] = with_content(o, cut, mine)
            first_image += count
        return self.renderer.splice(observations, turn_ids, tools)

    def _fit_images(self, splice: Splice, blocks: list[dict[str, Any]], budget: int) -> dict[int, str]:
        """The images of ``splice`` that do not fit ``budget`` (kept in order while they do),
        each with the text that takes its place."""
        extra = self.renderer.placeholder_extra
        notes: dict[int, str] = {}
        used = 0
        for i, tokens in enumerate(splice.image_tokens):
            if used + tokens + extra <= budget:
                used += tokens + extra
            else:
                notes[i] = not_shown(
                    blocks[i], f"its {tokens + extra} tokens do not fit max_obs_tokens={budget}"
                )
        return notes

    def _cut(self, ids: list[int], max_tokens: int) -> str:
        marker = self.config.truncation_marker.format(n=len(ids) - max_tokens)
        return self.codec.decode(ids[:max_tokens]) + marker


def content_text(content: Any) -> str:
    """The text of a message's content: a string, or its text blocks joined."""
    if isinstance(content, list):
        return "\n".join(str(b.get("text") or "") for b in content if b.get("type") == "text")
    return str(content or "")


def with_content(message: dict[str, Any], cut: str | None, notes: dict[int, str]) -> dict[str, Any]:
    """``message`` with its text replaced by ``cut`` (None keeps it) and its images numbered
    in ``notes`` replaced by those texts. Cut text takes the first text block's place."""
    content = message.get("content")
    if not isinstance(content, list):
        return message if cut is None else dict(message, content=cut)
    blocks: list[dict[str, Any]] = []
    image = 0
    placed = False
    for block in content:
        if block.get("type") == "image":
            note = notes.get(image)
            image += 1
            blocks.append(block if note is None else {"type": "text", "text": note})
        elif block.get("type") == "text" and cut is not None:
            if not placed:
                blocks.append({"type": "text", "text": cut})
                placed = True
        else:
            blocks.append(block)
    return dict(message, content=blocks)


def share(available: int, lengths: list[int]) -> list[int | None]:
    """Token limits per observation: None keeps it whole; an int cuts it there.

    Water-filling: observations shorter than an equal share keep all their tokens, and
    what they leave is shared among the longer ones.
    """
    limits: list[int | None] = [None] * len(lengths)
    left, remaining = max(0, available), len(lengths)
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        share = left // remaining
        if lengths[i] <= share:
            left -= lengths[i]
        else:
            limits[i] = share
            left -= share
        remaining -= 1
    return limits
