"""What veRL's trainer trained on and what its rollout replica served, written to disk for a check.

Installed by ``cpu_platform`` when ``TOOLFACTORY_VERL_PROBE=DIR`` is set (the CPU test and
``bench/gpu_check.sh`` set it; a user's run does not), in veRL's own ``RayPPOTrainer``:

* ``_update_actor`` (the batch veRL trains on): ``DIR/batch_step{N}.pt`` holds its token
  layout, ``response_mask``, the rewards (``token_level_scores``/``_rewards``), the
  ``advantages`` and the log-probs (rollout, old);
* the weight push (``checkpoint_manager.update_weights(step)``), after it returns, and once
  before the first update (``sync_step0``): a fixed prompt (the first prompt the trainer saw)
  is greedily continued by the replica *through veRL's own server client*, and the trainer's
  actor scores the same tokens with veRL's ``_compute_old_log_prob``; both go to
  ``DIR/sync_step{N}.pt``. So after step 1 the replica's log-probs must differ from step 0's
  and equal the trainer's (within bfloat16).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from typing import Any

import torch

PROBE_ENV = "TOOLFACTORY_VERL_PROBE"
PROBE_TOKENS = 16
BATCH_KEYS = (
    "prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask",
    "token_level_scores", "token_level_rewards", "advantages", "returns", "old_log_probs",
    "rollout_log_probs", "ref_log_prob",
)  # fmt: skip


def probe_dir() -> Path | None:
    value = os.environ.get(PROBE_ENV, "").strip()
    return Path(value) if value else None


def _save(name: str, payload: dict[str, Any]) -> None:
    folder = probe_dir()
    assert folder is not None
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(payload, folder / name)


def _record_batch(trainer: Any, batch: Any) -> None:
    tensors = {key: batch.batch[key].detach().clone() for key in BATCH_KEYS if key in batch.batch}
    extras = batch.non_tensor_batch
    stats = list(extras.get("toolfactory", []))
    uids = [str(u) for u in extras.get("uid", [])]  # GRPO's groups (rows may be reordered by balancing)
    _save(f"batch_step{trainer.global_steps}.pt", {"batch": tensors, "toolfactory": stats, "uid": uids})
    if getattr(trainer, "_toolfactory_probe_row", None) is None:
        trainer._toolfactory_probe_row = batch[:1]  # the fixed prompt: the first the trainer saw
        trainer._toolfactory_probe_rows = len(batch)  # a size veRL's micro-batching accepts
        _probe_sync(
            trainer, trainer.global_steps - 1
        )  # before the first update: the weights it rolled out with


def _scored_row(row: Any, tokens: list[int], copies: int) -> Any:
    """``row`` (a one-row DataProto of the rollout layout) with its response replaced by ``tokens``."""
    from verl import DataProto

    prompts = row.batch["prompts"]
    width = row.batch["responses"].shape[1]
    responses = torch.zeros((1, width), dtype=prompts.dtype)
    responses[0, : len(tokens)] = torch.tensor(tokens, dtype=prompts.dtype)
    response_valid = torch.zeros((1, width), dtype=row.batch["attention_mask"].dtype)
    response_valid[0, : len(tokens)] = 1
    attention_mask = torch.cat([row.batch["attention_mask"][:, : prompts.shape[1]], response_valid], dim=1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    one = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": response_valid,
    }
    # as many identical rows as a trained batch: veRL's micro-batches must divide the batch
    probe = DataProto.from_dict({key: value.repeat(copies, 1) for key, value in one.items()})
    probe.meta_info = dict(row.meta_info)
    return probe


def _probe_sync(trainer: Any, step: int) -> None:
    row = getattr(trainer, "_toolfactory_probe_row", None)
    if row is None:
        return  # the first push, before any batch: the fixed prompt is not known yet
    prompt_ids = row.batch["prompts"][0][row.batch["attention_mask"][0, : row.batch["prompts"].shape[1]] == 1]
    client = trainer.llm_server_manager.get_client()
    sampling = {"temperature": 0.0, "top_p": 1.0, "max_tokens": PROBE_TOKENS, "logprobs": True}

    async def generate() -> Any:
        return await client.generate(
            f"toolfactory-probe-{uuid.uuid4().hex}", prompt_ids=prompt_ids.tolist(), sampling_params=sampling
        )

    output = asyncio.run(generate())
    tokens = list(output.token_ids)
    probe = _scored_row(row, tokens, trainer._toolfactory_probe_rows)
    probe.meta_info["temperature"] = 1.0  # the replica's log-probs are of the untempered policy
    old_log_prob, _mfu = trainer._compute_old_log_prob(probe)
    trainer_logprobs = old_log_prob.batch["old_log_probs"][0, : len(tokens)].float()
    _save(
        f"sync_step{step}.pt",
        {
            "prompt_ids": prompt_ids.clone(),
            "tokens": tokens,
            "replica_logprobs": torch.tensor(list(output.log_probs or []), dtype=torch.float32),
            "trainer_logprobs": trainer_logprobs.clone(),
        },
    )


def install() -> None:
    """Wrap ``RayPPOTrainer._update_actor`` and ``init_workers`` (for the weight push)."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    if getattr(RayPPOTrainer, "_toolfactory_probe", False):
        return
    RayPPOTrainer._toolfactory_probe = True
    update_actor, init_workers = RayPPOTrainer._update_actor, RayPPOTrainer.init_workers

    def _update_actor(self: Any, batch: Any) -> Any:
        _record_batch(self, batch)
        return update_actor(self, batch)

    def _init_workers(self: Any) -> None:
        init_workers(self)
        push = self.checkpoint_manager.update_weights

        def update_weights(global_steps: int | None = None, *args: Any, **kwargs: Any) -> Any:
            result = push(global_steps, *args, **kwargs)
            _probe_sync(self, int(global_steps or 0))
            return result

        self.checkpoint_manager.update_weights = update_weights

    RayPPOTrainer._update_actor = _update_actor
    RayPPOTrainer.init_workers = _init_workers
