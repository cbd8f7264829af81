"""``trainer-client sft``: a supervised warm start on solved trajectories, before GRPO.

    trainer-client sft --server http://127.0.0.1:8000 --gold runs/gold.jsonl \\
        --train-data data/train.parquet --toolset bank-0 --verifier tool_use --out-dir runs/sft
    trainer-client sft --trajectories runs/rollouts.jsonl --min-reward 1.0 --out-dir runs/sft-rs
    trainer-client train --model runs/sft/model ...          # GRPO from the warm start

Sources (``training.sft_data``): ``--gold`` replays a training task's gold turns through the
rollout core against the tool server (real observations, the rollout's masks; rows of any
split but ``train`` are refused), ``--trajectories`` takes the policy's own rollouts whose
reward reaches ``--min-reward`` (rejection sampling). Every ``SFTConfig`` field is a flag, and
``--config FILE.yaml`` gives them too (flags win). Output in ``--out-dir``: ``model/`` (HF),
``metrics.jsonl`` (loss per step), ``summary.json``, ``gold.jsonl`` (the gold replays, a
rollout JSONL: ``trainer-client show`` reads it) and, with ``--export verl-parquet``,
``sft.parquet`` for veRL's SFT trainer (``trainer_client.verl.sft_dataset``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

import orjson

from trainer_client.cli.flags import add_dataclass_flags, config_values
from trainer_client.cli.subcommands import Subcommand, register_subcommand
from trainer_client.shared import CliError

__all__ = ["config_from_args", "configure", "run", "sft_examples"]

GOLD_RECORDS = "gold.jsonl"
PARQUET = "sft.parquet"


def configure(parser: argparse.ArgumentParser) -> None:
    """One flag per ``SFTConfig`` field (help from its field doc)."""
    from trainer_client.training.sft_config import SFTConfig

    parser.add_argument("--config", help="YAML file with SFTConfig fields (flags override it)")
    add_dataclass_flags(parser, SFTConfig, aliases={"verifier_arguments": ["--verifier-args"]})
    parser.add_argument("-v", "--verbose", action="store_true", help="log each step to stderr")


def config_from_args(args: argparse.Namespace) -> Any:
    """An ``SFTConfig`` from ``--config`` plus the flags that were given."""
    from trainer_client.training.sft_config import SFTConfig

    values = config_values(args, SFTConfig)
    return SFTConfig.from_dict(values)


def sft_examples(config: Any) -> list[Any]:
    """The examples of both sources (gold replays written to ``<out_dir>/gold.jsonl``)."""
    from trainer_client.rollout.dataset import load_tasks
    from trainer_client.training.sft_data import (
        examples_from_records,
        load_gold,
        read_trajectories,
        refuse_held_out,
        replay_gold,
    )

    examples = []
    if config.gold:
        gold = load_gold(config.gold)
        rows = load_tasks(config.train_data)
        records = asyncio.run(replay_gold(config, rows, gold))
        out = Path(config.out_dir).expanduser()
        out.mkdir(parents=True, exist_ok=True)
        (out / GOLD_RECORDS).write_bytes(b"".join(orjson.dumps(r, default=str) + b"\n" for r in records))
        examples += examples_from_records(
            records, min_reward=config.min_reward, source=f"gold ({config.gold})"
        )
    for path in config.trajectories:
        examples += examples_from_records(read_trajectories(path), min_reward=config.min_reward, source=path)
    refuse_held_out(examples, config.held_out)
    if config.max_examples is not None:
        examples = examples[: config.max_examples]
    return examples


def write_verl_parquet(examples: list[Any], path: Path) -> Path:
    import pandas as pd

    from trainer_client.training.sft_data import verl_parquet_rows

    pd.DataFrame(verl_parquet_rows(examples)).to_parquet(path, index=False)
    return path


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        config = config_from_args(args)
        from trainer_client.cli.preflight import check_model

        check_model(config.model)
        examples = sft_examples(config)
    except (ValueError, TypeError, CliError) as exc:
        print(f"trainer-client sft: error: {exc}", file=sys.stderr)
        return 2
    out = Path(config.out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {
        "examples": len(examples),
        "model_tokens": sum(e.model_tokens for e in examples),
    }
    if config.export == "verl-parquet":
        summary["parquet"] = str(write_verl_parquet(examples, out / PARQUET))
    if config.train:
        from trainer_client.training.sft import SFTTrainer

        summary.update(SFTTrainer(config, examples).train())
        summary.pop("config", None)
    print(json.dumps(summary, indent=2))
    return 0


COMMAND = register_subcommand(
    Subcommand(
        "sft",
        "supervised warm start: train on gold or successful trajectories, rendered and masked as rollouts",
        configure,
        run,
        description=(
            "Supervised fine-tuning on solved trajectories before GRPO: gold turns of the training split "
            "replayed through the rollout core against the tool server (--gold, --train-data), or the policy's "
            "own rollouts whose reward reaches --min-reward (--trajectories). Loss on model tokens only "
            "(prompt and observations mask 0). Writes an HF model directory for trainer-client train --model, "
            "and with --export verl-parquet the data for veRL's SFT trainer."
        ),
    )
)
