"""``TokenSFTDataset``: veRL's multi-turn SFT trainer on ``trainer-client sft --export verl-parquet`` data, token-exact.

veRL's own ``MultiTurnSFTDataset`` renders a parquet's ``messages`` column again, message by
message, and learns every assistant message: the worked examples in a few-shot prompt too. Our
export also carries the rollout core's ``input_ids`` and ``loss_mask`` (prompt and observations
0, model tokens 1); this class hands those to veRL's trainer as they are, with the same padding
modes, ``max_length`` and ``truncation`` as veRL's class. Select it by veRL's own option::

    python -m verl.trainer.sft_trainer data.train_files=runs/sft/sft.parquet \\
        data.custom_cls.path=pkg://trainer_client.verl.sft_dataset data.custom_cls.name=TokenSFTDataset ...

(``data.custom_cls.path`` is a file path or ``pkg://module``: veRL's ``load_extern_object``.)
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["TokenSFTDataset"]


def _get(config: Any, key: str, default: Any) -> Any:
    getter = getattr(config, "get", None)
    value = getter(key, default) if getter is not None else default
    return default if value is None else value


class TokenSFTDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Rows of ``input_ids`` and ``loss_mask`` lists; the constructor takes veRL's dataset arguments."""

    def __init__(
        self,
        parquet_files: str | list[str],
        tokenizer: Any,
        config: Any = None,
        processor: Any = None,
        max_samples: int = -1,
    ) -> None:
        import pandas as pd

        files = [parquet_files] if isinstance(parquet_files, str) else list(parquet_files)
        frame = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
        missing = {"input_ids", "loss_mask"} - set(frame.columns)
        if missing:
            raise ValueError(
                f"{files}: no {sorted(missing)} column; write the data with trainer-client sft --export verl-parquet"
            )
        if max_samples and max_samples > 0:
            frame = frame.iloc[:max_samples]
        self.input_ids = [list(map(int, ids)) for ids in frame["input_ids"]]
        self.loss_mask = [list(map(int, mask)) for mask in frame["loss_mask"]]
        self.tokenizer = tokenizer
        self.pad_mode = _get(config, "pad_mode", "right")
        self.max_length = int(_get(config, "max_length", 1024))
        self.truncation = _get(config, "truncation", "error")
        if self.pad_mode not in ("right", "no_padding"):
            raise ValueError(f"pad_mode must be right or no_padding, got {self.pad_mode!r}")

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, item: int) -> dict[str, torch.Tensor]:
        ids, mask = self.input_ids[item], self.loss_mask[item]
        if len(ids) > self.max_length:
            if self.truncation == "error":
                raise ValueError(f"row {item}: {len(ids)} tokens, more than max_length {self.max_length}")
            keep = slice(-self.max_length, None) if self.truncation == "left" else slice(0, self.max_length)
            ids, mask = ids[keep], mask[keep]
        input_ids = torch.tensor(ids, dtype=torch.long)
        loss_mask = torch.tensor(mask, dtype=torch.long)
        positions = torch.arange(len(ids), dtype=torch.long)
        if self.pad_mode == "no_padding":
            return {"input_ids": input_ids, "position_ids": positions, "loss_mask": loss_mask}
        pad = self.max_length - len(ids)
        pad_id = (
            self.tokenizer.pad_token_id if getattr(self.tokenizer, "pad_token_id", None) is not None else 0
        )
        return {
            "input_ids": torch.cat([input_ids, torch.full((pad,), pad_id, dtype=torch.long)]),
            "attention_mask": torch.cat(
                [torch.ones(len(ids), dtype=torch.long), torch.zeros(pad, dtype=torch.long)]
            ),
            "position_ids": torch.cat([positions, torch.zeros(pad, dtype=torch.long)]),
            "loss_mask": torch.cat([loss_mask, torch.zeros(pad, dtype=torch.long)]),
        }
