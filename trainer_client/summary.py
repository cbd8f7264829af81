"""Summaries of a rollout run: the numbers one looks at first, as a dict and a text table.

Works on trajectory *records* (the dicts the CLI writes as JSONL, see
``trainer_client.cli.trajectory_record``), so a summary can be recomputed later from
the file alone: ``summarize(read_records(path))``.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


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
