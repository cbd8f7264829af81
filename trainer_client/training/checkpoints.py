"""Training checkpoints: the model in HF format plus the trainer's state, written atomically.

``<out>/checkpoints/step_N/`` holds ``save_pretrained`` output (model and tokenizer) and
``trainer_state.pt`` (optimizer, data cursor, RNG states, elapsed time); ``latest`` names
the newest. A checkpoint is written under a temporary name and renamed, so a run killed
mid-save never leaves a half-written ``latest``.

The weights are saved as the trainer holds them: float32, also for ``dtype=bfloat16``
(its float32 master weights, so a resume continues from exactly them). Checkpoints of
bfloat16 runs made before the trainer kept float32 weights hold bfloat16 ones: they load
(widened to float32), and AdamW's state loads cast to the weights' dtype.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "latest_checkpoint",
    "load_checkpoint",
    "restore_trainer_state",
    "save_checkpoint",
    "trainer_state",
]

logger = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
LATEST = "latest"
STATE_FILE = "trainer_state.pt"


def save_checkpoint(
    out_dir: Path, step: int, *, model: Any, tokenizer: Any, state: dict[str, Any], keep: int
) -> Path:
    """Write checkpoint ``step_N`` (``state``: the trainer's own, e.g. optimizer and RNG) and keep the newest ``keep``."""
    root = out_dir / CHECKPOINTS
    target = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    torch.save(state, tmp / STATE_FILE)
    if target.exists():
        shutil.rmtree(target)
    os.rename(tmp, target)
    (root / LATEST).write_text(target.name)
    kept = sorted(p for p in root.glob("step_*") if p.is_dir())
    for old in kept[: max(0, len(kept) - max(1, keep))]:
        shutil.rmtree(old, ignore_errors=True)
    logger.info("saved checkpoint %s", target)
    return target


def latest_checkpoint(out_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run, or None (a dangling ``latest`` is logged and ignored)."""
    latest = out_dir / CHECKPOINTS / LATEST
    if not latest.is_file():
        return None
    path = out_dir / CHECKPOINTS / latest.read_text().strip()
    if not (path / STATE_FILE).is_file():
        logger.warning("checkpoint pointer %s names no usable checkpoint; starting fresh", latest)
        return None
    return path


def load_checkpoint(path: Path, model: Any) -> dict[str, Any]:
    """Load the checkpoint's weights into ``model`` and return its trainer state."""
    from transformers import AutoModelForCausalLM

    state = torch.load(path / STATE_FILE, weights_only=False)
    weights = AutoModelForCausalLM.from_pretrained(path, dtype=next(model.parameters()).dtype)
    model.load_state_dict(weights.state_dict())
    return state


def trainer_state(trainer: Any) -> dict[str, Any]:
    """What a ``GRPOTrainer`` saves beside its model: optimizer, step, data cursor, RNG states,
    elapsed time and, with a curriculum, its windows and each level's cursor."""
    state = {
        "optimizer": trainer.optimizer.state_dict(),
        "step": trainer.step,
        "epoch": trainer.epoch,
        "cursor": trainer.cursor,
        "order": trainer.order,
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        "elapsed_s": trainer.elapsed_s(),
    }
    if trainer.curriculum is not None:
        state["curriculum"] = {
            **trainer.curriculum.state_dict(),
            "cursors": dict(trainer.level_cursors),
            "epochs": dict(trainer.level_epochs),
        }
    return state


def restore_trainer_state(trainer: Any, state: dict[str, Any]) -> None:
    """``trainer_state``'s inverse, on a trainer whose model is already loaded."""
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.step, trainer.epoch, trainer.cursor = (
        int(state["step"]),
        int(state["epoch"]),
        int(state["cursor"]),
    )
    trainer.order = list(state["order"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    trainer.elapsed_before_s = float(state.get("elapsed_s", 0.0))
    if trainer.curriculum is not None and "curriculum" in state:
        saved = state["curriculum"]
        trainer.curriculum.load_state_dict(saved)
        trainer.level_cursors = {int(k): int(v) for k, v in saved.get("cursors", {}).items()}
        trainer.level_epochs = {int(k): int(v) for k, v in saved.get("epochs", {}).items()}
