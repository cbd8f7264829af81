"""The multi-step learning run: GRPO teaches SmolLM2-135M tasks that need one, two or chained calls.

    make vllm                                                            # once: .venv-vllm
    .venv/bin/python examples/learn_multistep.py                         # the published run (~60 min)
    .venv/bin/python examples/learn_multistep.py --pilot                 # 3 steps
    .venv/bin/python examples/learn_multistep.py --no-warm-start ...     # GRPO alone (flags in README)
    .venv/bin/python examples/learn_multistep.py --engine hf ...         # generation in process (~4x slower)

What it does (issue 29; examples/learn_environment.py is the one-call run it extends):

1. builds a procedural bank pack at levels 1-3 (one call; two independent calls; a chain
   whose second call uses the first one's output) and its rows as ``python -m tools.data
   build --tasks env:...`` does; the prompt is the shared few-shot text prefix of
   ``tools.data.env_prompts`` with ``MULTI_CALL_FORMAT`` (a task may need several calls,
   results feed the next call) and one worked example per level 1-4 (one, two, a chain of
   two, and three calls);
2. serves the pack with ``tool-server serve`` on ``--port`` (default: a free one);
3. runs ``trainer-client train --curriculum`` (printed first): prompts drawn by level, from
   the lowest level whose groups do not yet succeed (``--promote-at``) and, for review, the
   levels below; reward ``tool_use`` in train mode with the verifier's default weights
   (per-call credit; no shortcut pays, tests/verifiers/test_tool_use_shortcuts.py);
   held-out success ``tool_use`` eval mode == 1.0, overall and per level;
   First (unless ``--no-warm-start``) a short warm start, ``trainer-client sft`` (printed too): the
   gold turns of the first ``--sft-examples`` training tasks (``tools.data.gold``, in the prompt's
   own call and reply format) replayed against the server and learned (model tokens only), then
   GRPO from ``<out>/sft/model``: its evaluation before step 1 gives the warm start's own figures;
4. with ``--publish NAME``: ``examples/results/NAME.json`` (the run's summary, per-level
   curves, the mean step time split, the command) and ``NAME.png`` (held-out success per
   level, training success per level and the curriculum's frontier).

The seed fixes the pack, the split, the examples, the data order and the sampling: a rerun
of the first steps gives the same baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "examples")]  # tools, trainer_client; _run beside this file

import _run  # noqa: E402

from tools.data import write_parquet  # noqa: E402
from tools.data.env_prompts import MULTI_CALL_FORMAT, TAGGED_MULTI_CALL_FORMAT  # noqa: E402
from tools.data.gold import gold_script, write_gold  # noqa: E402
from tools.envs.procedural import pack  # noqa: E402

LEVELS = [1, 2, 3]
EXAMPLE_LEVELS = [1, 2, 3, 4]  # one worked example each: 1, 2, 2 chained and 3 calls


def pack_arguments(args: argparse.Namespace) -> dict[str, object]:
    """The pack's arguments (levels 1-3): the server builds the same pack (same id) from them."""
    return _run.pack_arguments(args, LEVELS)


def build_data(args: argparse.Namespace) -> tuple[str, Path, Path]:
    """The pack id and the train/test parquet files (few-shot text prompts); with ``--warm-start``
    also ``data/gold.jsonl``, the gold turns of the training split (in the prompts' reply format)."""
    p = pack(**pack_arguments(args))
    tagged = args.reply_format == "tagged"
    rows = _run.few_shot_splits(
        p, args, LEVELS, len(EXAMPLE_LEVELS), example_levels=EXAMPLE_LEVELS,
        call_format=TAGGED_MULTI_CALL_FORMAT if tagged else MULTI_CALL_FORMAT, tagged_replies=tagged,
    )  # fmt: skip
    if args.warm_start:
        taught = [r for r in rows["train"] if r["extra_info"]["level"] in args.warm_start_levels]
        write_gold(gold_script(p, taught, tagged_replies=tagged), gold_path(args))
    # held out: up to eval_size / 3 tasks of each level (the first ones of the test split)
    per_level = max(1, args.eval_size // len(LEVELS))
    test = [
        row
        for level in LEVELS
        for row in [r for r in rows["test"] if r["extra_info"]["level"] == level][:per_level]
    ]
    train = write_parquet(rows["train"], args.out / "data" / "train.parquet")
    held_out = write_parquet(test, args.out / "data" / "test.parquet")
    return p.id, train, held_out


def gold_path(args: argparse.Namespace) -> Path:
    return args.out / "data" / "gold.jsonl"


def sft_dir(args: argparse.Namespace) -> Path:
    return args.out / "sft"


def rollout_shape(args: argparse.Namespace, pack_id: str) -> list[str]:
    """The rollout flags ``train`` and ``sft`` share: the warm start's data is tokenized, spliced and
    masked exactly as the GRPO run's rollouts."""
    return [
        "--toolset", pack_id,
        "--format", "hermes",
        "--tool-schemas", "none",
        "--max-turns", str(args.max_turns),
        "--max-calls-per-turn", "4",
        "--max-tokens-per-turn", "96",
        "--response-length", "448",
        "--max-obs-tokens", "128",
    ]  # fmt: skip


def sft_argv(args: argparse.Namespace, url: str, pack_id: str, train: Path, test: Path) -> list[str]:
    """The ``trainer-client sft`` arguments of ``--warm-start``: the gold of the training split,
    kept where the eval-mode reward says solved (a held-out task in it would be an error)."""
    return [
        "sft",
        "--server", url,
        "--gold", str(gold_path(args)),
        "--train-data", str(train),
        "--held-out", str(test),
        *rollout_shape(args, pack_id),
        "--verifier", "tool_use",
        "--verifier-args", json.dumps({"mode": "eval"}),
        "--out-dir", str(sft_dir(args)),
        "--epochs", str(args.sft_epochs),
        "--batch-size", str(args.sft_batch_size),
        "--lr", str(args.sft_lr),
        "--threads", str(args.sft_threads),
        "--seed", str(args.seed),
        "--verbose",
        *(["--max-minutes", str(args.sft_max_minutes)] if args.sft_max_minutes else []),
        *(["--max-examples", str(args.sft_examples)] if args.sft_examples else []),
        *(["--max-steps", str(args.sft_steps)] if args.sft_steps else []),
    ]  # fmt: skip


def train_argv(args: argparse.Namespace, url: str, pack_id: str, train: Path, test: Path) -> list[str]:
    """The ``trainer-client train`` arguments of this run."""
    reward: dict[str, Any] = {"mode": "train"}
    if args.weights:
        reward["weights"] = json.loads(args.weights)
    argv = [
        "train",
        "--server", url,
        "--train-data", str(train),
        "--eval-data", str(test),
        *rollout_shape(args, pack_id),
        "--verifier", "tool_use",
        "--verifier-args", json.dumps(reward),
        "--eval-verifier", "tool_use",
        "--eval-verifier-args", json.dumps({"mode": "eval"}),
        *_run.schedule_flags(args, greedy_only=not args.sampled_eval),
    ]  # fmt: skip
    if args.curriculum:
        argv += [
            "--curriculum",
            "--curriculum-promote-at", str(args.promote_at),
            "--curriculum-window", str(args.window),
            "--curriculum-review", str(args.review),
        ]  # fmt: skip
    if args.clip_ratio_high is not None:
        argv += ["--clip-ratio-high", str(args.clip_ratio_high)]
    if args.max_num_gen_batches > 1:
        argv += ["--max-num-gen-batches", str(args.max_num_gen_batches)]
    if args.warm_start:
        argv += ["--model", str(sft_dir(args) / "model")]
    return argv


# --------------------------------------------------------------------------- per-level results


def level_curves(metrics: Path) -> dict[str, Any]:
    """Per-level curves of a run's metrics.jsonl: held-out (sampled, greedy) and training success
    per level, the curriculum's frontier, and the mean step time split."""
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    out: dict[str, Any] = {}
    for split in ("eval", "eval_greedy", "train"):
        curves: dict[str, list[list[float]]] = {}
        for r in (r for r in records if r.get("split") == split):
            for key, value in r.items():
                if key.startswith("success/level_"):
                    curves.setdefault(key.split("/", 1)[1], []).append([r["step"], value])
        out[split] = curves
    evals = [r for r in records if r.get("split") == "eval"]
    out["eval_temperature"] = evals[-1].get("temperature", 0.0) if evals else None
    train = [r for r in records if r.get("split") == "train"]
    out["frontier"] = [[r["step"], r["curriculum/frontier"]] for r in train if "curriculum/frontier" in r]
    keys = ("generate_s", "tools_s", "verify_s", "rollout_other_s", "update_s", "step_s", "cpu_s")
    out["mean_time_split_s"] = {
        k: round(sum(r.get(f"time/{k}", 0.0) for r in train) / len(train), 1) for k in keys if train
    }
    return out


def plot_levels(curves: dict[str, Any], png: Path) -> None:
    """Held-out success per level (sampled: solid, greedy: dashed) and training success per level
    with the curriculum's frontier, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (held, trained) = plt.subplots(1, 2, figsize=(11, 4), dpi=120)
    colors = {
        f"level_{level}": c for level, c in zip(LEVELS, ("tab:blue", "tab:orange", "tab:green"), strict=True)
    }
    sampled = f"T={curves['eval_temperature']:g}" if curves["eval_temperature"] else "greedy"
    for split, style in (("eval", "o-"), ("eval_greedy", "s--")):
        for level, points in sorted(curves[split].items()):
            label = f"{level} ({'greedy' if split == 'eval_greedy' else sampled})"
            held.plot(*zip(*points, strict=True), style, color=colors.get(level), label=label)
    held.set_title("held-out success per level")
    for level, points in sorted(curves["train"].items()):
        trained.plot(*zip(*points, strict=True), ".-", color=colors.get(level), alpha=0.7, label=level)
    if curves["frontier"]:
        frontier = trained.twinx()
        frontier.step(*zip(*curves["frontier"], strict=True), where="post", color="black", label="frontier")
        frontier.set_ylabel("curriculum frontier (level)")
        frontier.set_ylim(0.5, len(LEVELS) + 0.5)
        frontier.legend(loc="upper right")
    trained.set_title("training success per level (group mean)")
    for ax in (held, trained):
        ax.set_xlabel("GRPO step")
        ax.set_ylabel("success rate")
        ax.set_ylim(-0.02, 1.05)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)


def publish_levels(out: Path, name: str, command: list[str]) -> None:
    """``_run.publish`` (summary JSON, reward plot), then the per-level curves added to the JSON and
    the per-level plot as NAME.png."""
    _run.publish(out, name)
    curves = level_curves(out / "metrics.jsonl")
    path = _run.RESULTS / f"{name}.json"
    summary = json.loads(path.read_text())
    summary["per_level"] = curves
    summary["command"] = " ".join(command)
    path.write_text(json.dumps(summary, indent=2) + "\n")
    plot_levels(curves, _run.RESULTS / f"{name}.png")


def levels_list(text: str) -> list[int]:
    """``"1,2"`` -> ``[1, 2]``: levels of this run's pack, else an argparse error."""
    try:
        levels = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: levels are comma-separated numbers, e.g. 1,2") from None
    if not levels or not set(levels) <= set(LEVELS):
        raise argparse.ArgumentTypeError(f"{text!r}: levels among {LEVELS}")
    return levels


def build_parser() -> argparse.ArgumentParser:
    """The script's options; their defaults are the published run's flags."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _run.add_schedule_options(
        parser, out="learn_multistep", temperature=0.8, eval_size=48, eval_every=6, threads=2,
        max_minutes=45, prompts_per_step=6, lr=1e-5, engine="vllm", steps=60, group_size=8,
    )  # fmt: skip
    parser.add_argument("--world", default="bank", choices=("shop", "library", "bank", "calendar"))
    parser.add_argument("--tasks", type=int, default=360, help="tasks in the pack (levels 1-3, a third each)")
    parser.add_argument("--test-fraction", type=float, default=0.15)
    parser.add_argument("--max-turns", type=int, default=5, help="assistant turns (a level-3 task takes 3)")
    parser.add_argument("--no-curriculum", dest="curriculum", action="store_false", help="mix all levels")
    parser.add_argument(
        "--promote-at", type=float, default=0.6, help="curriculum: success that moves a level up"
    )
    parser.add_argument("--window", type=int, default=12, help="curriculum: recent groups per level it reads")
    parser.add_argument(
        "--review", type=float, default=0.25, help="curriculum: share of prompts below the frontier"
    )
    parser.add_argument(
        "--sampled-eval", action="store_true", help="also evaluate at --temperature (default: greedy only)"
    )
    parser.add_argument("--clip-ratio-high", type=float, default=None, help="DAPO clip-higher (e.g. 0.28)")
    parser.add_argument(
        "--max-num-gen-batches",
        type=int,
        default=1,
        help="DAPO dynamic sampling: roll out up to N batches a step until --prompts-per-step groups have "
        "a reward spread (1: off)",
    )
    parser.add_argument(
        "--weights", default=None, help="tool_use train weights as JSON (default: the verifier's)"
    )
    parser.add_argument(
        "--reply-format",
        choices=("mixed", "tagged"),
        default="tagged",
        help="how the prompt asks for the final reply: mixed (<answer> after a question, Done. after "
        "a change) or tagged (always <answer>...</answer>)",
    )
    parser.add_argument(
        "--warm-start",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="first a supervised warm start on the training split's gold (trainer-client sft), then GRPO "
        "from it (an existing <out>/sft/model is reused); --no-warm-start: GRPO from the packaged model",
    )
    parser.add_argument(
        "--warm-start-levels",
        type=levels_list,
        default=LEVELS,
        help="warm start: the levels whose gold it learns, e.g. 1 (GRPO then has levels 2-3 to learn "
        "on its own); default: all",
    )
    parser.add_argument(
        "--sft-examples",
        type=int,
        default=64,
        help="warm start: learn from the first N solved gold trajectories of the training split (a short "
        "warm start leaves GRPO room; 0: all)",
    )
    parser.add_argument(
        "--sft-steps",
        type=int,
        default=None,
        help="warm start: stop after N optimizer steps over the gold's seeded order (e.g. --sft-examples 0 "
        "--sft-steps 15: 120 of all the gold, the run in learn_multistep_w120.json); default: every batch",
    )
    parser.add_argument("--sft-epochs", type=int, default=1, help="warm start: passes over the gold")
    parser.add_argument("--sft-batch-size", type=int, default=8, help="warm start: trajectories per step")
    parser.add_argument("--sft-lr", type=float, default=1e-4, help="warm start: learning rate")
    parser.add_argument("--sft-threads", type=int, default=1, help="warm start: torch threads")
    parser.add_argument(
        "--sft-max-minutes",
        type=float,
        default=None,
        help="warm start: time budget (the model is saved then)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _run.parse_schedule(build_parser(), argv)
    pack_id, train, test = build_data(args)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _run.exit_on_sigterm()
    with _run.tool_server(args.out, _run.procedural_server_config(pack_arguments(args)), args.port) as url:
        if args.warm_start and not (sft_dir(args) / "model" / "config.json").is_file():
            code = _run.run_sft(sft_argv(args, url, pack_id, train, test))
            if code != 0:
                return code
        command = train_argv(args, url, pack_id, train, test)
        code = _run.run_trainer(command)
    if code == 0 and args.publish:
        publish_levels(args.out, args.publish, [sys.executable, *sys.argv])
    return code


if __name__ == "__main__":
    sys.exit(_run.main_interruptible(main))
