"""The learning run: GRPO teaches SmolLM2-135M to use a calculator on a 2-core CPU.

    .venv/bin/python examples/learn_arithmetic.py                              # the published run (~65 min)
    .venv/bin/python examples/learn_arithmetic.py --publish learn_arithmetic   # ... and copy its figures
    .venv/bin/python examples/learn_arithmetic.py --pilot                      # 3 steps: is there a signal?

The defaults are the flags of the published run (``examples/results/learn_arithmetic.json``):
2 torch threads, held-out evaluation every 10 steps with 2 samples per problem, a 60-minute
budget for the 40 steps.

What it does:

1. builds the arithmetic task exactly as ``python -m tools.data build --tasks arithmetic``
   does (default mix: 40 % ``a * b``, 60 % word problems needing two or three
   operations; 2000 training and 200 held-out problems; the first 64 held-out are
   evaluated);
2. starts ``tool-server serve`` with the calculator and the verifiers on a free port (``--port``);
3. runs ``trainer-client train`` (the same code path as the CLI, printed first) and,
   with ``--publish NAME``, copies ``reward_curve.png`` and a JSON of the figures to
   ``examples/results/``.

The choices, and why (examples/README.md, "The learning run"):

- **prompt**: the builder's system prompt plus three worked examples (question ->
  ``<tool_call>`` -> tool result -> ``<answer>``). FACTS.md: with the format only
  described, SmolLM2-135M made 0 valid calls in 48 samples; with worked examples, 21
  in 32, so GRPO has successes to reinforce from step one.
- **temperature 0.7** for training and the held-out samples: at 1.0 the 135M model
  mostly rambles (pilot: no correct sample in 64).
- **reward**: ``math_equal`` alone (1 for the exact number). A format-shaped reward was
  tried and collapsed the policy (see ``REWARD_VERIFIER``).
- **success** on the held-out split is ``math_equal`` alone, same prompt before and
  after training: one sample per problem at the training temperature, and greedy.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "examples")]  # tools, trainer_client; _run beside this file

import _run  # noqa: E402

from tools.data import arithmetic, write_parquet  # noqa: E402

SERVER_CONFIG = {
    "server": {"shutdown_grace_s": 2, "log_level": "warning"},
    "tools": [{"target": "tools.calculator:calculator", "toolsets": ["default", "math"]}],
    "verifiers": [
        {"target": "tools.verifiers.math:math_equal"},
        {"target": "tools.verifiers.format:format_check"},
        {"target": "tools.verifiers.weighted:weighted"},
    ],
}

# The reward is correctness alone: a quarter of the samples are right at the start, so
# most groups mix right and wrong. A format-shaped reward (math_equal + 0.1 x format) was
# tried first and collapsed the policy through a since-fixed bug (the format verifier read
# the prompt's worked examples as the model's calls; verify requests now carry
# response_start). Under GRPO any term that differs inside a group becomes a full-size
# advantage, so a shaping term must rank trajectories the way correctness would.
REWARD_VERIFIER = "math_equal"


def build_data(out: Path, n_train: int, n_test: int, seed: int) -> tuple[Path, Path]:
    """The arithmetic task exactly as ``python -m tools.data build --tasks arithmetic`` writes it."""
    rows = arithmetic.build_rows(n_train=n_train, n_test=n_test, seed=seed, few_shot=3)
    return (
        write_parquet(rows["train"], out / "data" / "train.parquet"),
        write_parquet(rows["test"], out / "data" / "test.parquet"),
    )


def train_argv(args: argparse.Namespace, url: str, train: Path, test: Path) -> list[str]:
    """The ``trainer-client train`` arguments of this run."""
    return [
        "train",
        "--server", url,
        "--train-data", str(train),
        "--eval-data", str(test),
        "--max-turns", "4",
        "--max-tokens-per-turn", "64",
        "--response-length", "320",
        "--max-obs-tokens", "64",
        "--verifier", REWARD_VERIFIER,
        "--eval-verifier", "math_equal",
        *_run.schedule_flags(args),
    ]  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The script's options; their defaults are the published run's flags."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _run.add_schedule_options(
        parser, out="learn_arithmetic", temperature=0.7, eval_size=64, eval_every=10, threads=2,
        eval_samples=2, max_minutes=60,
    )  # fmt: skip
    parser.add_argument("--n-train", type=int, default=2000)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = _run.parse_schedule(parser, argv)
    _run.say(
        f"building the arithmetic task: {args.n_train} training and 200 held-out problems in {args.out / 'data'}"
    )
    train, test = build_data(args.out, args.n_train, 200, args.seed)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _run.exit_on_sigterm()
    with _run.tool_server(args.out, SERVER_CONFIG, args.port) as url:
        _run.say_plan(args)
        code = _run.run_trainer(train_argv(args, url, train, test))
    if code == 0 and args.publish:
        _run.publish(args.out, args.publish)
    return code


if __name__ == "__main__":
    sys.exit(_run.main_interruptible(main))
