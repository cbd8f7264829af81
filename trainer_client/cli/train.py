"""``trainer-client train``: single-process GRPO against a tool server (CPU or one GPU).

    trainer-client train --server http://127.0.0.1:8000 \\
        --train-data data/arithmetic/train.parquet --eval-data data/arithmetic/test.parquet \\
        --verifier math_equal --steps 40 --out-dir runs/grpo-arith

Every ``GRPOConfig`` field is a flag (``--field-name``, its help the field's doc) and can
also come from ``--config FILE.yaml`` (same names); flags given on the command line win
over the file. ``--server`` defaults to ``$TOOLFACTORY_URL`` (comma-separated replicas). Output in ``--out-dir``:
``metrics.jsonl``, ``tensorboard/``, ``reward_curve.png``, ``summary.json``,
``checkpoints/step_N`` (HF model + optimizer; a rerun resumes from the latest).
Also runnable as ``python -m trainer_client.cli.train train ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from typing import Any

from trainer_client.cli.command import Subcommand, register_subcommand
from trainer_client.cli.flags import add_dataclass_flags, config_values
from trainer_client.shared import CliError


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``train`` arguments: one flag per ``GRPOConfig`` field (help from its field doc)."""
    from trainer_client.training.config import GRPOConfig

    parser.add_argument("--config", help="YAML file with GRPOConfig fields (flags override it)")
    add_dataclass_flags(
        parser,
        GRPOConfig,
        aliases={
            "verifier_arguments": ["--verifier-args"],
            "eval_verifier_arguments": ["--eval-verifier-args"],
        },
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log each step to stderr")


def config_from_args(args: argparse.Namespace) -> Any:
    """A ``GRPOConfig`` from ``--config`` plus the flags that were given."""
    from trainer_client.training.config import GRPOConfig

    values = config_values(args, GRPOConfig)
    if "train_data" not in values:
        raise ValueError("--train-data (or train_data in --config) is required")
    return GRPOConfig.from_dict(values)


def preflight(config: Any) -> None:
    """Typos and a server that cannot take the weights fail here, before the model loads."""
    from trainer_client.cli.preflight import check_model, check_verifier, check_weight_sync

    check_model(config.model)
    if config.engine == "vllm" and config.engine_url:
        check_weight_sync(config.engine_url)
    if config.server:
        check_verifier(config.verifier, config.server)
        if config.eval_verifier:
            check_verifier(config.eval_verifier, config.server)


def run(args: argparse.Namespace) -> int:
    from trainer_client.gc_tuning import freeze_startup_heap
    from trainer_client.training.grpo import GRPOTrainer

    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per HTTP request otherwise
    try:
        config = config_from_args(args)
        preflight(config)
    except (ValueError, TypeError, CliError) as exc:
        print(f"trainer-client train: error: {exc}", file=sys.stderr)
        return 2
    trainer = GRPOTrainer(config)
    freeze_startup_heap()  # the model, tokenizer and clients live as long as the process
    summary = asyncio.run(trainer.train())
    print(json.dumps({k: v for k, v in summary.items() if k != "eval_curve"}, indent=2))
    return 0


COMMAND = register_subcommand(
    Subcommand(
        "train",
        "GRPO-train a local HF model against a tool server (single process, CPU or one GPU)",
        configure,
        run,
        description=(
            "Group-relative policy optimization with veRL's advantage and loss functions: rollouts through "
            "the tool server (observation tokens masked out of the loss), reward from /v1/verify, AdamW with "
            "gradient accumulation, held-out evaluation, checkpoints, JSONL + TensorBoard logs and a reward plot."
        ),
    )
)


def main(argv: list[str] | None = None) -> int:
    """``python -m trainer_client.cli.train train ...`` (same as ``trainer-client train``)."""
    parser = argparse.ArgumentParser(prog="python -m trainer_client.cli.train")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help=COMMAND.help, description=COMMAND.description)
    configure(train)
    args = parser.parse_args(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
