"""One ``check_text_request`` for both text backends (HF and vLLM): the same refusals, each naming its backend."""

from __future__ import annotations

import asyncio

import pytest

from trainer_client.backends.base import check_text_request
from trainer_client.backends.vllm import VLLMGenerator


def test_empty_prompts_and_images_are_refused_with_where_to_go() -> None:
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        check_text_request("B", [], {}, "elsewhere")
    with pytest.raises(ValueError, match="^B cannot take image_data: use a VLM$"):
        check_text_request("B", [1], {"image_data": [b"png"]}, "use a VLM")
    check_text_request("B", [1], {"image_data": None}, "use a VLM")  # nothing to refuse


def test_the_vllm_backend_refuses_before_any_request() -> None:
    generator = VLLMGenerator("http://127.0.0.1:9")  # nothing listens: the check comes first
    with pytest.raises(ValueError, match="VLLMGenerator .* cannot take image_data"):
        asyncio.run(generator.generate("r", prompt_ids=[1], sampling_params={}, image_data=[b"x"]))
