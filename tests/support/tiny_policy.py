"""A tiny random causal LM with SmolLM2's tokenizer, and the trainer's update on a fixed group.

Enough for tests of what one ``GRPOTrainer.update`` does to the weights (precision, loss
terms) in seconds on a CPU: two narrow layers of Qwen2's shape (as ``bench/engines/gpu_check.py
--tiny``), saved as a float32 HF model folder that ``GRPOConfig.model`` can name.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from trainer_client.rollout.core import StopReason, Trajectory

TINY_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "tie_word_embeddings": True,
}


def tiny_model_dir(directory: Path, seed: int = 0) -> Path:
    """Write a random two-layer model (float32) and SmolLM2's tokenizer under ``directory``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config

    from trainer_client.backends.models import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("smollm2"))
    tokenizer.save_pretrained(directory)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        **TINY_SHAPE,
    )
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(directory)
    return directory


def training_rows(directory: Path) -> Path:
    """Two arithmetic rows (the trainer's constructor loads a dataset; these tests never roll it out)."""
    from tools.data import arithmetic, write_parquet

    return write_parquet(
        arithmetic.build_rows(n_train=2, n_test=0, seed=0)["train"], directory / "train.parquet"
    )


@contextmanager
def trainer_on(model_dir: Path, out_dir: Path, **config: Any) -> Iterator[Any]:
    """A real ``GRPOTrainer`` of the tiny model (``config``: more ``GRPOConfig`` fields), closed after."""
    from trainer_client.training.grpo import GRPOConfig, GRPOTrainer

    out_dir.mkdir(parents=True, exist_ok=True)
    trainer = GRPOTrainer(
        GRPOConfig(
            train_data=str(training_rows(out_dir)),
            model=str(model_dir),
            out_dir=str(out_dir / "run"),
            tensorboard=False,
            plot=False,
            **config,
        )
    )
    try:
        yield trainer
    finally:
        asyncio.run(trainer.close())


def one_group(tokenizer: Any, answers: Sequence[tuple[str, float]]) -> Any:
    """A ``RolloutBatch`` of one prompt's group: each answer (its tokens all the model's) with its reward."""
    from trainer_client.training.grpo import RolloutBatch

    prompt = list(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "What is 12 * 34?"}], add_generation_prompt=True
        )["input_ids"]
    )
    rows = []
    for text, reward in answers:
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        rows.append(
            Trajectory(
                prompt_ids=prompt,
                response_ids=ids,
                response_mask=[1] * len(ids),
                response_logprobs=[0.0] * len(ids),
                num_turns=1,
                stop_reason=StopReason.ANSWER,
                session_id="s",
                messages=[],
                reward_score=reward,
            )
        )
    return RolloutBatch.build(rows, [0] * len(rows))


def weights(model: Any) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def update_of(trainer: Any, batch: Any) -> dict[str, torch.Tensor]:
    """What one ``trainer.update`` on ``batch`` (veRL's GRPO advantages) changed, per parameter, in float32."""
    from trainer_client.training.grpo import grpo_advantages

    before = weights(trainer.model)
    trainer.update(batch, grpo_advantages(batch))
    return {name: p.detach().float() - before[name].float() for name, p in trainer.model.named_parameters()}
