"""The HF transformers generator with the real SmolLM2-135M-Instruct on CPU."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.require import require

torch = require("torch", reason="the HF backend needs torch (pip install torch==2.13.0)")

from tests.trainer.conftest import InProcessInvoker  # noqa: E402
from trainer_client.backends.base import STOP_COMPLETED, STOP_LENGTH, Generator  # noqa: E402
from trainer_client.backends.hf import HFGenerator  # noqa: E402
from trainer_client.rollout.core import RolloutConfig, RolloutCore, Task  # noqa: E402

QUESTIONS = [
    "What is the capital of France?",
    "Name a colour.",
    "Write one sentence about the sea and the sky.",
]


@pytest.fixture(scope="module")
def smol() -> Iterator[tuple[Any, Any]]:
    from trainer_client.backends.models import load_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread is far faster than two when the cores are shared
    try:
        yield load_model("smollm2")
    finally:
        torch.set_num_threads(threads)


def _prompt(tok: Any, question: str) -> list[int]:
    text = tok.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    return tok.backend_tokenizer.encode(text, add_special_tokens=False).ids


async def _generate_all(gen: HFGenerator, prompts: list[list[int]], params: dict) -> list[Any]:
    try:
        return list(
            await asyncio.gather(
                *(gen.generate(f"r{i}", prompt_ids=p, sampling_params=params) for i, p in enumerate(prompts))
            )
        )
    finally:
        await gen.aclose()


def _teacher_forced_logprobs(
    model: Any, prompt: list[int], tokens: list[int], temperature: float
) -> list[float]:
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
    if temperature > 0:
        logits = logits / temperature
    log_probs = torch.log_softmax(logits, -1)
    return [float(log_probs[i, t]) for i, t in enumerate(tokens)]


def test_batched_greedy_equals_unbatched_and_logprobs_are_the_models(smol: tuple[Any, Any]) -> None:
    tok, model = smol
    prompts = [_prompt(tok, q) for q in QUESTIONS]
    assert len({len(p) for p in prompts}) == 3  # different lengths: the batch is left-padded
    params = {"temperature": 0.0, "max_tokens": 10, "logprobs": True}

    single = HFGenerator(model, tok, max_batch_size=1)
    assert isinstance(single, Generator)
    alone = [asyncio.run(_generate_all(single, [p], params))[0] for p in prompts]
    batched_gen = HFGenerator(model, tok, max_batch_size=8, batch_wait_s=0.05)
    together = asyncio.run(_generate_all(batched_gen, prompts, params))

    assert batched_gen.batches == [3]  # one shared forward pass per step for all three
    for a, b, prompt in zip(alone, together, prompts, strict=True):
        assert a.token_ids == b.token_ids
        assert b.extra_fields["batch_size"] == 3
        assert b.log_probs == pytest.approx(a.log_probs, abs=1e-4)
        assert a.log_probs == pytest.approx(
            _teacher_forced_logprobs(model, prompt, a.token_ids, 0.0), abs=1e-4
        )
        assert a.stop_reason in (STOP_COMPLETED, STOP_LENGTH)


def test_sampling_is_seeded_and_logprobs_follow_the_temperature(smol: tuple[Any, Any]) -> None:
    tok, model = smol
    prompt = _prompt(tok, QUESTIONS[2])
    params = {"temperature": 0.7, "top_p": 0.9, "top_k": 50, "max_tokens": 8, "logprobs": True}
    runs = [
        asyncio.run(_generate_all(HFGenerator(model, tok), [prompt], {**params, "seed": seed}))[0]
        for seed in (7, 7, 8)
    ]
    assert runs[0].token_ids == runs[1].token_ids
    assert runs[0].token_ids != runs[2].token_ids
    expected = _teacher_forced_logprobs(model, prompt, runs[2].token_ids, 0.7)
    assert runs[2].log_probs == pytest.approx(expected, abs=1e-4)


def test_stop_strings_eos_and_token_budget(smol: tuple[Any, Any]) -> None:
    tok, model = smol
    prompt = _prompt(tok, QUESTIONS[2])
    greedy = {"temperature": 0.0, "max_tokens": 16}
    free = asyncio.run(_generate_all(HFGenerator(model, tok), [prompt], greedy))[0]
    text = tok.decode(free.token_ids)
    words = text.split()
    assert len(words) >= 5, text
    stop = words[3][:3]  # a string the greedy continuation is known to produce
    stopped = asyncio.run(_generate_all(HFGenerator(model, tok), [prompt], {**greedy, "stop": [stop]}))[0]
    assert stopped.extra_fields == {"finish_reason": "stop", "batch_size": 1, "stop_str": stop}
    assert stopped.stop_reason == STOP_COMPLETED
    assert stopped.token_ids == free.token_ids[: len(stopped.token_ids)]
    assert stop in tok.decode(stopped.token_ids) and stop not in tok.decode(stopped.token_ids[:-1])

    short = asyncio.run(_generate_all(HFGenerator(model, tok), [prompt], {**greedy, "max_tokens": 3}))[0]
    assert (short.token_ids, short.stop_reason, short.log_probs) == (free.token_ids[:3], STOP_LENGTH, None)

    hello = asyncio.run(
        _generate_all(HFGenerator(model, tok), [_prompt(tok, "Hi")], {**greedy, "max_tokens": 24})
    )[0]
    assert hello.extra_fields["finish_reason"] == "eos"
    assert hello.token_ids[-1] == tok.convert_tokens_to_ids("<|im_end|>")


def test_rollout_with_the_real_model(smol: tuple[Any, Any]) -> None:
    tok, model = smol
    few_shot = [
        {
            "role": "system",
            "content": 'You can call a calculator: <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}'
            "</tool_call>. Its result comes back, then give <answer>...</answer>.",
        },
        {"role": "user", "content": "What is 4 + 5?"},
        {
            "role": "assistant",
            "content": '<tool_call>{"name": "add", "arguments": {"a": 4, "b": 5}}</tool_call>',
        },
        {"role": "tool", "content": "9"},
        {"role": "assistant", "content": "<answer>9</answer>"},
    ]
    tasks = [
        Task([*few_shot, {"role": "user", "content": f"What is {a} + {b}?"}]) for a, b in ((2, 3), (10, 7))
    ]
    invoker = InProcessInvoker({"add": lambda a, b: a + b})
    generator = HFGenerator(model, tok, batch_wait_s=0.05)
    config = RolloutConfig(
        max_turns=2, response_length=96, sampling_params={"temperature": 0.0, "max_tokens": 32}
    )
    core = RolloutCore(tok, generator, invoker, config)

    async def run() -> list[Any]:
        try:
            return await core.run_batch(tasks)
        finally:
            await generator.aclose()

    trajectories = asyncio.run(run())
    assert max(generator.batches) == 2  # the two trajectories shared forward passes
    for tr in trajectories:
        assert tr.error is None
        assert len(tr.response_ids) == len(tr.response_mask) == len(tr.response_logprobs) <= 96
        assert tr.response_mask[0] == 1 and tr.response_logprobs[0] < 0.0
        assert all(lp == 0.0 for lp, m in zip(tr.response_logprobs, tr.response_mask, strict=True) if m == 0)
        assert invoker.released.count(tr.session_id) == 1
        assert tr.metrics["assistant_turns"] >= 1


def test_model_resolution(smol: tuple[Any, Any], tmp_path: Any) -> None:
    from trainer_client.backends.models import resolve_model_path

    tok, model = smol
    # The converted SmolLM2 ends turns with <|im_end|> (transformers' GGUF loader says <|im_start|>).
    assert (tok.eos_token, tok.eos_token_id, model.generation_config.eos_token_id) == ("<|im_end|>", 2, 2)
    chat = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True).endswith(
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    path = resolve_model_path("smollm2")
    assert resolve_model_path(str(path)) == path  # any local HF model dir works as is
    with pytest.raises(FileNotFoundError, match="no model hub is reachable"):
        resolve_model_path(str(tmp_path / "missing"))


def test_concurrent_first_use_converts_once(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading
    import time

    from trainer_client.backends import models as models

    conversions: list[str] = []

    def fake_convert(target: Any) -> None:  # stands in for the 30 s GGUF conversion
        conversions.append(str(target))
        time.sleep(0.2)
        target.mkdir(parents=True)
        (target / "config.json").write_text("{}")
        (target / "tokenizer_config.json").write_text("{}")

    monkeypatch.setenv("TOOLFACTORY_CACHE", str(tmp_path))
    monkeypatch.setattr(models, "_convert_smollm2", fake_convert)
    paths: list[Any] = []
    threads = [threading.Thread(target=lambda: paths.append(models.resolve_model_path())) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert conversions == [str(tmp_path / "models" / "smollm2-135m-instruct")]
    assert paths == [tmp_path / "models" / "smollm2-135m-instruct"] * 3


def test_an_empty_budget_ends_the_turn_for_length(smol: tuple[Any, Any]) -> None:
    """No token to generate: no tokens, stop reason ``length`` (it once landed in ``routed_experts``)."""
    tok, model = smol
    prompt = _prompt(tok, "What is 2 + 2?")
    (out,) = asyncio.run(
        _generate_all(HFGenerator(model, tok), [prompt], {"max_tokens": 0, "logprobs": True})
    )
    assert out.token_ids == [] and out.log_probs == []
    assert out.stop_reason == "length" and out.routed_experts is None
    assert out.extra_fields["finish_reason"] == "length"
