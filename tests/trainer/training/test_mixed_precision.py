"""``GRPOConfig.dtype=bfloat16`` is mixed precision: float32 master weights (AdamW updates
float32) and bfloat16 forward passes under ``torch.autocast``, in the update and in
generation. bfloat16 weights would round most of an AdamW step at lr 1e-5 away."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.require import require

require("verl")

from tests.support.tiny_policy import one_group, tiny_model_dir, trainer_on, update_of  # noqa: E402

ANSWERS = [("408", 1.0), ("512 is it", 0.0), ("<tool_call>x</tool_call>", 0.5), ("4 0 8", 0.0)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("tiny"))


def test_a_bfloat16_step_lands_what_a_float32_step_lands(tiny: Path, tmp_path: Path) -> None:
    """The same update at lr 1e-5 under bfloat16 and float32: the weights move by nearly the
    same amount, and nearly all of them move (bfloat16 weights kept ~15 % of them still)."""
    updates, weight_dtypes = {}, set()
    for dtype in ("float32", "bfloat16"):
        with trainer_on(tiny, tmp_path / dtype, dtype=dtype, lr=1e-5) as trainer:
            weight_dtypes |= {p.dtype for p in trainer.model.parameters()}
            updates[dtype] = update_of(trainer, one_group(trainer.tokenizer, ANSWERS))
    exact, mixed = updates["float32"], updates["bfloat16"]
    difference = sum(float((mixed[n] - exact[n]).pow(2).sum()) for n in exact) ** 0.5
    size = sum(float(exact[n].pow(2).sum()) for n in exact) ** 0.5
    changed = sum(int((d != 0).sum()) for d in mixed.values()) / sum(d.numel() for d in mixed.values())
    assert size > 0
    assert difference / size < 0.05, (
        f"the bfloat16 step differs from the float32 one by {difference / size:.1%}"
    )
    assert changed > 0.9, f"only {changed:.1%} of the weights changed under bfloat16"
    assert weight_dtypes == {torch.float32}, "float32 master weights"


def autocast_states(model: Any) -> tuple[list[tuple[str, bool, torch.dtype]], Any]:
    """Record (thread, autocast on?, autocast dtype) at every forward pass through ``model``'s
    first decoder layer (the update runs the decoder without the head: not ``model.forward``)."""
    seen: list[tuple[str, bool, torch.dtype]] = []
    device = next(model.parameters()).device.type

    def hook(module: Any, args: Any) -> None:
        seen.append(
            (
                threading.current_thread().name,
                torch.is_autocast_enabled(device),
                torch.get_autocast_dtype(device),
            )
        )

    return seen, model.model.layers[0].register_forward_pre_hook(hook)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_generation_and_the_update_compute_in_the_configured_dtype(
    tiny: Path, tmp_path: Path, dtype: str
) -> None:
    """Autocast is thread-local: generation (the generator's thread) and the update (the
    trainer's ``to_thread``) each enter it, so the policy sampled is the policy trained;
    float32 enters none (its numbers stay those of the published runs)."""
    with trainer_on(tiny, tmp_path, dtype=dtype, lr=1e-5) as trainer:
        seen, handle = autocast_states(trainer.model)
        batch = one_group(trainer.tokenizer, ANSWERS)

        async def generate_then_update() -> None:
            await trainer.generator.generate(
                "r",
                prompt_ids=batch.trajectories[0].prompt_ids,
                sampling_params={"temperature": 1.0, "max_tokens": 4, "seed": 0},
            )
            from trainer_client.training.grpo import grpo_advantages

            await asyncio.to_thread(trainer.update, batch, grpo_advantages(batch))

        asyncio.run(generate_then_update())
        handle.remove()
    threads = {name for name, _, _ in seen}
    assert any(name.startswith("hf-generate") for name in threads), threads
    assert len(threads) >= 2, f"the update ran in the generator's thread? {threads}"
    if dtype == "bfloat16":
        assert all(on and d == torch.bfloat16 for _, on, d in seen), seen
    else:
        assert not any(on for _, on, _ in seen), seen


def test_a_bfloat16_runs_checkpoint_is_float32_and_resumes_exactly(tiny: Path, tmp_path: Path) -> None:
    """Checkpoints hold the float32 master weights (a resume continues from exactly them);
    the weights pushed to vLLM are still written in bfloat16."""
    from safetensors.torch import load_file

    from trainer_client.training.vllm_policy import save_for_vllm

    with trainer_on(tiny, tmp_path, dtype="bfloat16", lr=1e-5) as trainer:
        update_of(trainer, one_group(trainer.tokenizer, ANSWERS))
        trainer.step = 1
        saved = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        path = trainer.save_checkpoint()
        save_for_vllm(trainer.model, tmp_path / "vllm")
    assert {t.dtype for t in load_file(path / "model.safetensors").values()} == {torch.float32}
    pushed = load_file(tmp_path / "vllm" / "model.safetensors")
    assert {t.dtype for t in pushed.values()} == {torch.bfloat16} and "lm_head.weight" in pushed
    with trainer_on(tiny, tmp_path, dtype="bfloat16", lr=1e-5) as resumed:
        assert resumed.step == 1
        for name, p in resumed.model.named_parameters():
            assert p.dtype == torch.float32 and torch.equal(p.detach(), saved[name]), name
        assert all(s["exp_avg"].dtype == torch.float32 for s in resumed.optimizer.state.values()), (
            "AdamW's moments resume in float32"
        )


def test_a_bfloat16_checkpoint_of_an_older_run_resumes_in_float32(tiny: Path, tmp_path: Path) -> None:
    """Runs before float32 master weights saved bfloat16 weights and AdamW state: they resume,
    widened to float32 (the same values)."""
    with trainer_on(tiny, tmp_path, dtype="bfloat16", lr=1e-3) as trainer:
        trainer.model.to(torch.bfloat16)  # what such a run trained
        trainer.optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=1e-3)
        update_of(trainer, one_group(trainer.tokenizer, ANSWERS))
        trainer.step = 1
        saved = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainer.save_checkpoint()
    with trainer_on(tiny, tmp_path, dtype="bfloat16", lr=1e-3) as resumed:
        assert resumed.step == 1
        for name, p in resumed.model.named_parameters():
            assert p.dtype == torch.float32 and torch.equal(p.detach(), saved[name].float()), name
        assert {s["exp_avg"].dtype for s in resumed.optimizer.state.values()} == {torch.float32}
        update_of(resumed, one_group(resumed.tokenizer, ANSWERS))  # and it trains on
