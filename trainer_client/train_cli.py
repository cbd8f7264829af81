"""``trainer-client train``: single-process GRPO against a tool server (CPU or one GPU).

    trainer-client train --server http://127.0.0.1:8000 \\
        --train-data data/arithmetic/train.parquet --eval-data data/arithmetic/test.parquet \\
        --verifier math_equal --steps 40 --out-dir runs/grpo-arith

Every ``GRPOConfig`` field can also come from ``--config FILE.yaml`` (same names);
flags given on the command line win over the file. Output in ``--out-dir``:
``metrics.jsonl``, ``tensorboard/``, ``reward_curve.png``, ``summary.json``,
``checkpoints/step_N`` (HF model + optimizer; a rerun resumes from the latest).
Also runnable as ``python -m trainer_client.train_cli train ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from trainer_client.cli import Subcommand, register_subcommand
from trainer_client.shared import URL_ENV

# flag -> (GRPOConfig field, type, help). Types: int, float, str, "json", "bool".
_FLAGS: dict[str, tuple[str, Any, str]] = {
    "--train-data": ("train_data", str, "training split, veRL-format parquet (python -m tools.data build)"),
    "--eval-data": ("eval_data", str, "held-out split, veRL-format parquet"),
    "--out-dir": ("out_dir", str, "run folder: metrics, tensorboard, plot, checkpoints (default runs/grpo)"),
    "--model": ("model", str, "'smollm2' (packaged SmolLM2-135M-Instruct) or a local HF model dir"),
    "--device": ("device", str, "torch device: cpu (default), cuda, cuda:1, ..."),
    "--dtype": ("dtype", str, "float32 (default) or bfloat16"),
    "--threads": ("threads", int, "torch CPU threads (1 is fastest on a busy 2-core machine)"),
    "--seed": ("seed", int, "data order and sampling seed (default 0)"),
    "--steps": ("steps", int, "optimizer steps in total (default 20)"),
    "--prompts-per-step": ("prompts_per_step", int, "prompts per step (default 8)"),
    "--group-size": ("group_size", int, "rollouts per prompt, the GRPO group (default 8)"),
    "--micro-batch-size": ("micro_batch_size", int, "rows per forward/backward; gradients accumulate"),
    "--micro-batch-tokens": (
        "micro_batch_tokens",
        int,
        "padded tokens per forward/backward (memory bound, default 1024)",
    ),
    "--lr": ("lr", float, "AdamW learning rate (default 1e-5)"),
    "--weight-decay": ("weight_decay", float, "AdamW weight decay (default 0)"),
    "--warmup-steps": ("warmup_steps", int, "linear learning-rate warm-up steps (default 0)"),
    "--max-grad-norm": ("max_grad_norm", float, "gradient clipping norm (default 1.0)"),
    "--clip-ratio": ("clip_ratio", float, "PPO clip ratio (default 0.2)"),
    "--loss-agg-mode": ("loss_agg_mode", str, "veRL agg_loss mode (default token-mean)"),
    "--kl-coef": ("kl_coef", float, "KL-to-reference loss coefficient; 0 (default) loads no reference model"),
    "--kl-type": ("kl_type", str, "veRL kl_penalty type (default low_var_kl)"),
    "--entropy-coeff": ("entropy_coeff", float, "entropy bonus coefficient (default 0)"),
    "--format": ("format", str, "tool-call format: hermes (default), search_r1, llama3_json, pythonic"),
    "--toolset": ("toolset", str, "server toolset the model may use"),
    "--tool-schemas": (
        "tool_schemas",
        str,
        "tool schemas through the chat template: auto (default: where the template renders them and "
        "the prompt does not name the tools), server (always), none",
    ),
    "--max-turns": ("max_turns", int, "assistant turns per trajectory (default 4)"),
    "--max-calls-per-turn": ("max_calls_per_turn", int, "tool calls run per turn (default 4)"),
    "--max-obs-tokens": ("max_obs_tokens", int, "tokens one observation turn may add (default 128)"),
    "--response-length": (
        "response_length",
        int,
        "response tokens per trajectory, model + tools (default 384)",
    ),
    "--max-tokens-per-turn": (
        "max_tokens_per_turn",
        int,
        "tokens one generation turn may produce (default 128)",
    ),
    "--temperature": ("temperature", float, "sampling temperature of training rollouts (default 1.0)"),
    "--top-p": ("top_p", float, "nucleus sampling of training rollouts (default 1.0)"),
    "--verifier": ("verifier", str, "server verifier giving the reward (default math_equal)"),
    "--verifier-args": ("verifier_arguments", "json", "verifier arguments as JSON"),
    "--eval-verifier": ("eval_verifier", str, "verifier for held-out success (default: --verifier)"),
    "--eval-verifier-args": ("eval_verifier_arguments", "json", "its arguments as JSON"),
    "--success-threshold": ("success_threshold", float, "eval score counted as success (default 1.0)"),
    "--eval-every": ("eval_every", int, "evaluate every N steps; 0 = only at start and end (default 5)"),
    "--eval-size": ("eval_size", int, "held-out rows evaluated (default 64)"),
    "--eval-temperature": ("eval_temperature", float, "eval sampling temperature (default 0: greedy)"),
    "--eval-samples": ("eval_samples", int, "rollouts per held-out problem (default 1)"),
    "--save-every": ("save_every", int, "checkpoint every N steps; 0 disables (default 10)"),
    "--keep-checkpoints": ("keep_checkpoints", int, "checkpoints kept (default 2)"),
    "--generation-batch-size": ("generation_batch_size", int, "rows decoded together (default 32)"),
    "--max-train-rows": ("max_train_rows", int, "use only the first N training rows"),
    "--max-minutes": ("max_minutes", float, "stop training after this many minutes (then evaluate)"),
}
_SWITCHES: dict[str, tuple[str, bool, str]] = {
    "--no-resume": ("resume", False, "start fresh even if the out dir has a checkpoint"),
    "--greedy-eval": ("greedy_eval", True, "also evaluate greedily at the start and the end"),
    "--no-eval-at-start": ("eval_at_start", False, "skip the baseline evaluation before step 1"),
    "--no-tensorboard": ("tensorboard", False, "JSONL logs only"),
    "--no-plot": ("plot", False, "do not write reward_curve.png"),
    "--no-norm-adv-by-std": ("norm_adv_by_std", False, "Dr.GRPO: do not divide advantages by the group std"),
}


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``train`` arguments (all default to None: unset flags fall back to the file/defaults)."""
    parser.add_argument("--config", help="YAML file with GRPOConfig fields (flags override it)")
    parser.add_argument(
        "--server",
        action="append",
        help=f"tool server URL; repeat for replicas (default ${URL_ENV} or http://127.0.0.1:8000)",
    )
    for flag, (_name, kind, text) in _FLAGS.items():
        parser.add_argument(flag, type=str if kind in ("json", "bool") else kind, default=None, help=text)
    for flag, (_name, _value, text) in _SWITCHES.items():
        parser.add_argument(flag, action="store_true", default=None, help=text)
    parser.add_argument("-v", "--verbose", action="store_true", help="log each step to stderr")


def config_from_args(args: argparse.Namespace) -> Any:
    """A ``GRPOConfig`` from ``--config`` plus the flags that were given."""
    import yaml

    from trainer_client.grpo import GRPOConfig

    values: dict[str, Any] = {}
    if args.config:
        path = Path(args.config).expanduser()
        if not path.is_file():
            raise ValueError(f"config file {path} not found")
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{path} must hold a mapping of GRPOConfig fields")
        values.update(loaded)
    for flag, (name, kind, _text) in _FLAGS.items():
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is None:
            continue
        if kind == "json":
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{flag} must be JSON, e.g. '{{\"normalize\": true}}': {exc}") from None
        values[name] = value
    for flag, (name, switched, _text) in _SWITCHES.items():
        if getattr(args, flag.lstrip("-").replace("-", "_")):
            values[name] = switched
    if args.server:
        values["server"] = args.server
    elif "server" not in values and os.environ.get(URL_ENV):
        values["server"] = [u for u in os.environ[URL_ENV].split(",") if u]
    if "train_data" not in values:
        raise ValueError("--train-data (or train_data in --config) is required")
    return GRPOConfig.from_dict(values)


def run(args: argparse.Namespace) -> int:
    from trainer_client.grpo import GRPOTrainer

    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per HTTP request otherwise
    try:
        config = config_from_args(args)
    except (ValueError, TypeError) as exc:
        print(f"trainer-client train: error: {exc}", file=sys.stderr)
        return 2
    summary = asyncio.run(GRPOTrainer(config).train())
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
    """``python -m trainer_client.train_cli train ...`` (same as ``trainer-client train``)."""
    parser = argparse.ArgumentParser(prog="python -m trainer_client.train_cli")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help=COMMAND.help, description=COMMAND.description)
    configure(train)
    args = parser.parse_args(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
