"""Supervised fine-tuning on solved trajectories: the warm start before GRPO.

The loss is the negative log-likelihood of the model tokens of each trajectory (mask 1), the
prompt and the observations (mask 0) only conditioning it, averaged over a step's model tokens.
It is computed with the GRPO update's own pieces: ``logprobs.response_logprobs`` (after the
prompt prefix all rows share, computed once per step: ``shared_prefix``), ``grpo.micro_batches``
(rows sorted by length within a token budget) and AdamW on float32 weights with the compute
in ``dtype`` under autocast. The result is an HF model directory, ``<out_dir>/model``, that
``trainer-client train --model`` and the vLLM engine start from.

    examples = examples_from_records(records, min_reward=1.0, source="gold")
    summary = SFTTrainer(config, examples).train()
"""

from __future__ import annotations

import json
import logging
import os
import resource
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from trainer_client.backends.hf_prefix import prompt_prefix
from trainer_client.backends.models import autocast, load_model, torch_dtype
from trainer_client.training.grpo import clipped_step, micro_batches
from trainer_client.training.logprobs import response_logprobs, shared_prefix
from trainer_client.training.sft_config import SFTConfig
from trainer_client.training.sft_data import SFTExample, shuffled

__all__ = ["MODEL_DIR", "SFTTrainer", "compute_dtype"]

logger = logging.getLogger(__name__)

MODEL_DIR = "model"
METRICS_FILE = "metrics.jsonl"


def compute_dtype(config: SFTConfig) -> torch.dtype:
    """``config.dtype``, else float32 on a CPU that emulates bf16 (3-50x slower there) and bf16 elsewhere."""
    if config.dtype:
        return torch_dtype(config.dtype)
    if config.device.startswith("cpu"):
        from trainer_client.backends.vllm_server import cpu_dtype

        return torch_dtype(cpu_dtype())
    return torch.bfloat16


class SFTTrainer:
    """``SFTTrainer(config, examples).train()``: ``epochs`` passes in steps of ``batch_size``."""

    def __init__(self, config: SFTConfig, examples: Sequence[SFTExample]) -> None:
        if not examples:
            raise ValueError("no examples to learn from")
        self.config = cfg = config
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.examples = list(examples)
        self.out_dir = Path(cfg.out_dir).expanduser()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.dtype = compute_dtype(cfg)
        if self.dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"SFTConfig.dtype must be float32 or bfloat16, got {cfg.dtype!r}")
        self.tokenizer, self.model = load_model(cfg.model, device=cfg.device, dtype=torch.float32)
        self.pad_token_id = int(self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.step = 0

    def batches(self) -> list[list[SFTExample]]:
        """Every epoch's examples in a seeded order, ``batch_size`` at a time; the first
        ``max_steps`` of them when set."""
        size = self.config.batch_size
        out = []
        for epoch in range(self.config.epochs):
            order = shuffled(self.examples, self.config.seed, epoch)
            out += [order[i : i + size] for i in range(0, len(order), size)]
        return out[: self.config.max_steps]

    def loss_sums(
        self, batch: Sequence[SFTExample], *, backward: bool, scale: float = 1.0
    ) -> tuple[float, float]:
        """(summed NLL, model tokens) of ``batch``; with ``backward`` the gradient of ``sum * scale``
        accumulates in the model (micro-batches within the token budget, one prefix pass)."""
        cfg = self.config
        ids = prompt_prefix([e.prompt_ids for e in batch])
        grad = torch.enable_grad() if backward else torch.no_grad()
        nll_sum, tokens = 0.0, 0.0
        with grad:
            with autocast(self.model.device, self.dtype):
                prefix = shared_prefix(self.model, ids, detach=backward) if ids else None
            for idx in micro_batches(batch, range(len(batch)), cfg.micro_batch_size, cfg.micro_batch_tokens):
                rows = [batch[i] for i in idx]
                width = max(len(e.response_ids) for e in rows)
                mask = torch.zeros((len(rows), width), dtype=torch.float32, device=self.model.device)
                for i, e in enumerate(rows):
                    mask[i, : len(e.response_mask)] = torch.tensor(e.response_mask, dtype=torch.float32)
                with autocast(self.model.device, self.dtype):
                    log_prob, _ = response_logprobs(
                        self.model,
                        [e.prompt_ids for e in rows],
                        [e.response_ids for e in rows],
                        pad_token_id=self.pad_token_id,
                        prefix=prefix,
                    )
                nll = -(log_prob.float() * mask).sum()
                if backward:
                    (nll * scale).backward()
                nll_sum += float(nll.detach())
                tokens += float(mask.sum())
            if backward and prefix is not None:
                prefix.backward()
        return nll_sum, tokens

    def mean_loss(self, examples: Sequence[SFTExample] | None = None) -> float:
        """Mean NLL per model token over ``examples`` (default: all), without gradients."""
        self.model.eval()
        examples = list(examples or self.examples)
        size = self.config.batch_size
        nll, tokens = 0.0, 0.0
        for i in range(0, len(examples), size):
            s, t = self.loss_sums(examples[i : i + size], backward=False)
            nll, tokens = nll + s, tokens + t
        return nll / tokens if tokens else 0.0

    def train_step(self, batch: Sequence[SFTExample]) -> dict[str, float]:
        """One AdamW step on ``batch``: the mean NLL over its model tokens."""
        cfg = self.config
        warmup = cfg.warmup_steps
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.lr * (min(1.0, (self.step + 1) / warmup) if warmup > 0 else 1.0)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        tokens = float(sum(e.model_tokens for e in batch))
        nll, _ = self.loss_sums(batch, backward=True, scale=1.0 / max(tokens, 1.0))
        grad_norm = clipped_step(self.model, self.optimizer, cfg.max_grad_norm, self.step + 1)
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return {
            "loss": nll / max(tokens, 1.0),
            "grad_norm": grad_norm,
            "tokens": tokens,
            "rows": float(len(batch)),
        }

    def train(self) -> dict[str, Any]:
        """All steps, then the model saved as ``<out_dir>/model``; returns (and writes) the summary."""
        started = time.perf_counter()
        batches = self.batches()
        sample = shuffled(self.examples, self.config.seed, -1)[: self.config.loss_sample or None]
        loss_before = self.mean_loss(sample)
        with open(self.out_dir / METRICS_FILE, "w") as log:
            for batch in batches:
                budget = self.config.max_minutes
                if budget is not None and time.perf_counter() - started > 60.0 * budget:
                    logger.warning(
                        "time budget of %g min reached after %d of %d steps", budget, self.step, len(batches)
                    )
                    break
                t0 = time.perf_counter()
                record = {"step": self.step + 1, **self.train_step(batch)}
                record["time/step_s"] = time.perf_counter() - t0
                record["memory/max_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
                log.write(json.dumps(record) + "\n")
                log.flush()
                logger.info("sft step %d/%d loss %.4f", self.step, len(batches), record["loss"])
        loss_after = self.mean_loss(sample)
        model_dir = self.save()
        summary = {
            "model_dir": str(model_dir),
            "examples": len(self.examples),
            "model_tokens": sum(e.model_tokens for e in self.examples),
            "steps": self.step,
            "planned_steps": len(batches),
            "epochs": self.config.epochs,
            "lr": self.config.lr,
            "dtype": str(self.dtype).removeprefix("torch."),
            "loss_before": loss_before,
            "loss_after": loss_after,
            "loss_measured_on": len(sample),
            "wall_s": round(time.perf_counter() - started, 1),
            "load_avg": os.getloadavg()[0],
            "sources": sorted({e.source for e in self.examples}),
            "config": {k: v for k, v in asdict(self.config).items() if k != "server"},
        }
        (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    def save(self) -> Path:
        """The model and tokenizer as ``<out_dir>/model`` (written aside, then renamed into place)."""
        target = self.out_dir / MODEL_DIR
        tmp = self.out_dir / f".tmp_{MODEL_DIR}"
        shutil.rmtree(tmp, ignore_errors=True)
        self.model.save_pretrained(tmp)
        self.tokenizer.save_pretrained(tmp)
        shutil.rmtree(target, ignore_errors=True)
        os.rename(tmp, target)
        return target
