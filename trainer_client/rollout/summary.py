"""Summaries of rollout and training runs: the numbers one looks at first.

Rollout runs: ``summarize`` works on trajectory *records* (the dicts the CLI writes as
JSONL, see ``trainer_client.rollout.records.trajectory_record``), so a summary can be recomputed
later from the file alone; ``format_summary`` prints it as a table.

Training runs: ``RunLog`` writes a run's ``metrics.jsonl`` (and TensorBoard events) and a
few sample trajectories per step; ``summarize_run`` and ``plot_reward_curve`` read the
JSONL back (first and last held-out success, the reward curve as a PNG).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
PLOT_FILE = "reward_curve.png"


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _std(values: Sequence[float]) -> float | None:
    if len(values) < 2:
        return 0.0 if values else None
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _rewards(records: Iterable[Mapping[str, Any]]) -> list[float]:
    return [float(r["reward"]) for r in records if r.get("reward") is not None]


def _success(reward: float | None, threshold: float) -> bool:
    return reward is not None and reward >= threshold - 1e-9


def summarize(
    records: Sequence[Mapping[str, Any]],
    *,
    wall_s: float | None = None,
    client_metrics: Mapping[str, Any] | None = None,
    success_threshold: float = 1.0,
) -> dict[str, Any]:
    """Aggregate trajectory records into one flat-ish dict (JSON-serialisable).

    ``success`` means reward >= ``success_threshold``; ``prompt_success_rate`` is the
    fraction of prompts with at least one successful sample (pass@n).
    """
    rewards = _rewards(records)
    metrics = [r.get("metrics") or {} for r in records]
    model_tokens = sum(sum(r.get("response_mask") or ()) for r in records)
    all_tokens = sum(len(r.get("response_mask") or ()) for r in records)
    by_prompt: dict[Any, bool] = {}
    for r in records:
        key = (r.get("data_source"), r.get("index"))
        by_prompt[key] = by_prompt.get(key, False) or _success(r.get("reward"), success_threshold)
    sources: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        sources[str(r.get("data_source") or "?")].append(r)
    summary: dict[str, Any] = {
        "trajectories": len(records),
        "prompts": len(by_prompt),
        "scored": len(rewards),
        "reward_mean": _mean(rewards),
        "reward_std": _std(rewards),
        "success_rate": _mean([float(_success(r.get("reward"), success_threshold)) for r in records]),
        "prompt_success_rate": _mean([float(v) for v in by_prompt.values()]),
        "tool_calls": sum(int(m.get("calls", 0)) for m in metrics),
        "tool_errors": sum(int(m.get("tool_errors", 0)) for m in metrics),
        "parse_errors": sum(int(m.get("parse_errors", 0)) for m in metrics),
        "trajectories_with_calls": sum(1 for m in metrics if m.get("calls")),
        "verify_errors": sum(1 for m in metrics if m.get("verify_error")),
        "mean_assistant_turns": _mean([float(m.get("assistant_turns", 0)) for m in metrics]),
        "max_num_turns": max((int(r.get("num_turns") or 0) for r in records), default=0),
        "model_tokens": model_tokens,
        "observation_tokens": all_tokens - model_tokens,
        "mean_response_tokens": all_tokens / len(records) if records else None,
        "stop_reasons": dict(Counter(str(r.get("stop_reason")) for r in records).most_common()),
        "errors": [r["error"] for r in records if r.get("error")][:5],
        "mean_generate_s": _mean([float(m.get("generate_s", 0.0)) for m in metrics]),
        "mean_tool_s": _mean([float(m.get("tool_s", 0.0)) for m in metrics]),
        "wall_s": wall_s,
        "model_tokens_per_s": model_tokens / wall_s if wall_s else None,
        "by_data_source": {
            name: {
                "trajectories": len(group),
                "reward_mean": _mean(_rewards(group)),
                "success_rate": _mean([float(_success(r.get("reward"), success_threshold)) for r in group]),
                "tool_calls": sum(int((r.get("metrics") or {}).get("calls", 0)) for r in group),
            }
            for name, group in sorted(sources.items())
        },
    }
    if client_metrics is not None:
        summary["client"] = {
            "batches": client_metrics.get("batches"),
            "mean_batch_size": client_metrics.get("mean_batch_size"),
            "retries": client_metrics.get("retries"),
            "transport_errors": dict(client_metrics.get("errors") or {}),
            "tool_error_kinds": dict(client_metrics.get("result_errors") or {}),
            "call_latency_ms": dict(client_metrics.get("latency_ms") or {}),
        }
    return summary


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={_fmt(v)}" for k, v in value.items()) or "none"
    return str(value)


def _table(rows: Sequence[Sequence[str]], header: Sequence[str] | None = None) -> list[str]:
    all_rows = [list(header)] if header else []
    all_rows += [list(r) for r in rows]
    widths = [max(len(r[i]) for r in all_rows) for i in range(len(all_rows[0]))]
    lines = []
    for n, row in enumerate(all_rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if header and n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def format_summary(summary: Mapping[str, Any], *, title: str = "rollout summary") -> str:
    """A plain-text table of a ``summarize`` dict (for terminals and logs)."""
    n = summary["trajectories"] or 1
    rows = [
        ("trajectories", f"{_fmt(summary['trajectories'])} ({_fmt(summary['prompts'])} prompts)"),
        ("reward mean ± std", f"{_fmt(summary['reward_mean'])} ± {_fmt(summary['reward_std'])}"),
        ("success rate", _fmt(summary["success_rate"])),
        ("prompt success (any sample)", _fmt(summary["prompt_success_rate"])),
        (
            "tool calls",
            f"{_fmt(summary['tool_calls'])} ({summary['tool_calls'] / n:.2f}/trajectory, "
            f"{_fmt(summary['trajectories_with_calls'])} trajectories made any)",
        ),
        ("tool errors", _fmt(summary["tool_errors"])),
        ("parse errors (malformed calls)", _fmt(summary["parse_errors"])),
        ("mean assistant turns", _fmt(summary["mean_assistant_turns"])),
        ("max num_turns", _fmt(summary["max_num_turns"])),
        (
            "model / observation tokens",
            f"{_fmt(summary['model_tokens'])} / {_fmt(summary['observation_tokens'])}",
        ),
        ("model tokens/s", _fmt(summary["model_tokens_per_s"])),
        ("stop reasons", _fmt(summary["stop_reasons"])),
        ("mean generate s / tool s", f"{_fmt(summary['mean_generate_s'])} / {_fmt(summary['mean_tool_s'])}"),
        ("wall s", _fmt(summary["wall_s"])),
    ]
    if summary.get("verify_errors"):
        rows.append(("verify errors", _fmt(summary["verify_errors"])))
    client = summary.get("client")
    if client:
        rows += [
            ("client batches (mean size)", f"{_fmt(client['batches'])} ({_fmt(client['mean_batch_size'])})"),
            ("client retries", _fmt(client["retries"])),
            ("tool error kinds", _fmt(client["tool_error_kinds"])),
            ("transport errors", _fmt(client["transport_errors"])),
        ]
    lines = [title, *_table(rows)]
    sources = summary.get("by_data_source") or {}
    if len(sources) > 1 or (sources and "?" not in sources):
        lines.append("")
        lines += _table(
            [
                (
                    name,
                    _fmt(s["trajectories"]),
                    _fmt(s["reward_mean"]),
                    _fmt(s["success_rate"]),
                    _fmt(s["tool_calls"]),
                )
                for name, s in sources.items()
            ],
            header=("data source", "n", "reward", "success", "tool calls"),
        )
    for error in summary.get("errors") or ():
        lines.append(f"error: {error}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- training runs


def trajectory_stats(trajectories: Sequence[Any], threshold: float) -> dict[str, float]:
    """Reward, success, length and tool-use means of a step's (or an evaluation's) trajectories."""
    rewards = [float(t.reward_score or 0.0) for t in trajectories]
    calls = [t.metrics.get("calls", 0) for t in trajectories]
    errors = [t.metrics.get("tool_errors", 0) for t in trajectories]

    def mean(values: Iterable[float]) -> float:
        return _mean(list(values)) or 0.0

    stats = {
        "reward": mean(rewards),
        "success": mean(float(r >= threshold) for r in rewards),
        "response_length": mean(len(t.response_ids) for t in trajectories),
        "model_tokens": mean(sum(t.response_mask) for t in trajectories),
        "num_turns": mean(t.num_turns for t in trajectories),
        "tool_calls": mean(calls),
        "tool_errors": mean(errors),
        "tool_error_rate": (sum(errors) / sum(calls)) if sum(calls) else 0.0,
        "parse_errors": mean(t.metrics.get("parse_errors", 0) for t in trajectories),
        "answered": mean(float(t.final_answer is not None) for t in trajectories),
        "unscored": float(sum(t.reward_score is None for t in trajectories)),
    }
    components: dict[str, list[float]] = defaultdict(list)
    for t in trajectories:
        for key, value in t.reward_components.items():
            components[key].append(float(value))
    for key, values in components.items():
        stats[f"reward/{key}"] = mean(values)
    return stats


class RunLog:
    """A training run's records: ``metrics.jsonl`` (and TensorBoard, if installed) and sample trajectories."""

    def __init__(self, out_dir: Path, *, tensorboard: bool = True) -> None:
        self.out_dir = out_dir
        self.tensorboard = tensorboard
        self._writer: Any = None

    def write(self, record: dict[str, Any]) -> None:
        """Append one record (``split`` and ``step`` required); numbers also go to TensorBoard."""
        with open(self.out_dir / METRICS_FILE, "a") as handle:
            handle.write(json.dumps(record) + "\n")
        if self.tensorboard and self._writer is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard not installed: JSONL only
                self.tensorboard = False
                return
            self._writer = SummaryWriter(str(self.out_dir / "tensorboard"))
        if self._writer is None:
            return
        for key, value in record.items():
            if key not in ("time", "split", "step") and isinstance(value, int | float):
                self._writer.add_scalar(f"{record['split']}/{key}", value, record["step"])
        self._writer.flush()

    def samples(self, split: str, step: int, trajectories: Sequence[Any]) -> None:
        """A few trajectories in samples.jsonl: what the model actually wrote."""
        with open(self.out_dir / SAMPLES_FILE, "a") as handle:
            for t in trajectories:
                task = t.task
                record = {
                    "split": split,
                    "step": step,
                    "reward": t.reward_score,
                    "ground_truth": task.ground_truth if task else None,
                    "kind": task.metadata.get("kind") if task else None,
                    "stop_reason": str(t.stop_reason),
                    "messages": t.messages[len(task.messages) if task else 0 :],
                }
                handle.write(json.dumps(record, default=str) + "\n")

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The JSONL records of a run (train and eval), in order."""
    path = Path(path)
    if not path.is_file():
        return []
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def summarize_run(path: str | os.PathLike[str]) -> dict[str, Any]:
    """First and last eval success, failure-rate ratio, steps and minutes of a run."""
    records = read_metrics(path)
    evals = [r for r in records if r.get("split") == "eval"]
    train = [r for r in records if r.get("split") == "train"]
    summary: dict[str, Any] = {"steps": train[-1]["step"] if train else 0}
    if records:
        summary["minutes"] = records[-1].get("elapsed_min")
    if evals:
        first, last = evals[0], evals[-1]
        best = max(evals, key=lambda r: r["success"])
        summary.update(
            baseline_success=first["success"],
            final_success=last["success"],
            best_success=best["success"],
            best_step=best["step"],
            eval_size=last.get("eval_size"),
            eval_samples=last.get("eval_samples"),
            eval_temperature=last.get("temperature"),
            final_minutes=last.get("elapsed_min"),
            best_minutes=best.get("elapsed_min"),
            baseline_failure=1 - first["success"],
            final_failure=1 - last["success"],
        )
        if first["success"] < 1:
            summary["failure_ratio"] = round((1 - last["success"]) / (1 - first["success"]), 3)
        summary["eval_curve"] = [[r["step"], r.get("elapsed_min"), r["success"]] for r in evals]
        kinds = sorted(k for k in last if k.startswith("success/"))
        if kinds:
            summary["per_kind"] = {k.split("/", 1)[1]: [first.get(k), last.get(k)] for k in kinds}
    greedy = [r for r in records if r.get("split") == "eval_greedy"]
    if greedy:
        summary["greedy_baseline_success"] = greedy[0]["success"]
        summary["greedy_final_success"] = greedy[-1]["success"]
        summary["greedy_steps"] = [greedy[0]["step"], greedy[-1]["step"]]
        kinds = sorted(k for k in greedy[-1] if k.startswith("success/"))
        if kinds:
            summary["greedy_per_kind"] = {
                k.split("/", 1)[1]: [greedy[0].get(k), greedy[-1].get(k)] for k in kinds
            }
    if train:
        summary["train_reward_first"] = train[0]["reward"]
        summary["train_reward_last"] = train[-1]["reward"]
        summary["rollout_tokens_per_s"] = round(_mean([r["rollout_tokens_per_s"] for r in train]), 1)
        summary["tool_calls_per_s"] = round(_mean([r["tool_calls_per_s"] for r in train]), 2)
    return summary


def plot_reward_curve(metrics_path: str | os.PathLike[str], out_png: str | os.PathLike[str]) -> Path | None:
    """Training reward (and its moving average) and held-out success against steps, as a PNG."""
    records = read_metrics(metrics_path)
    train = [r for r in records if r.get("split") == "train"]
    evals = [r for r in records if r.get("split") == "eval"]
    if not train and not evals:
        return None
    with contextlib.suppress(ImportError):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
        if train:
            steps = [r["step"] for r in train]
            rewards = [r["reward"] for r in train]
            ax.plot(steps, rewards, color="tab:blue", alpha=0.35, label="train reward (batch mean)")
            window = 5
            smooth = [_mean(rewards[max(0, i - window + 1) : i + 1]) for i in range(len(rewards))]
            ax.plot(steps, smooth, color="tab:blue", label=f"train reward ({window}-step mean)")
        if evals:
            temperature = evals[-1].get("temperature", 0.0)
            ax.plot(
                [r["step"] for r in evals],
                [r["success"] for r in evals],
                "o-",
                color="tab:red",
                label=f"held-out success (T={temperature:g})",
            )
        greedy = [r for r in records if r.get("split") == "eval_greedy"]
        if greedy:
            ax.plot(
                [r["step"] for r in greedy],
                [r["success"] for r in greedy],
                "s--",
                color="tab:green",
                label="held-out success (greedy)",
            )
        ax.set_xlabel("GRPO step")
        ax.set_ylabel("reward / success rate")
        ax.set_ylim(-0.02, 1.1)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
        ax.set_title("GRPO with tool calls")
        fig.tight_layout()
        out = Path(out_png)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out)
        plt.close(fig)
        return out
    logger.warning("matplotlib is not installed; no plot written (pip install matplotlib)")
    return None


# --------------------------------------------------------------------------- decode attention for GQA on CPU
