"""The data of a supervised warm start: trajectories as the rollout core renders them, and only solved ones.

Both sources end as rollout records (``rollout.records``: one line of a ``trainer-client
rollout`` JSONL), so an example's tokens and masks are the rollout path's own, token for token:

* **gold**: a training task's gold turns (``tools.data.gold``) are replayed through the rollout
  core with a scripted generator (``cli.generators.scripted_backend``, as ``rollout --script``)
  against the tool server: real tool results, spliced with the chat template (mask 0), each
  model turn cut by the format's stop strings as an engine would cut it, then scored by the
  server's verifier. Rows of any split but ``train`` are refused: held-out tasks cannot get in.
* **trajectories**: the policy's own rollouts (a ``trainer-client rollout`` JSONL), kept when
  their reward reaches ``min_reward`` (rejection sampling).

An ``SFTExample`` is ``prompt_ids`` (mask 0), ``response_ids`` and ``response_mask`` (1 on model
tokens, 0 on observations and template tokens): the loss is the model tokens' negative
log-likelihood. ``verl_parquet_rows`` gives the same examples as rows for veRL's multi-turn SFT
trainer (``trainer_client.verl.sft_dataset``).
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from trainer_client.rollout.dataset import TaskRow
from trainer_client.rollout.records import read_records
from trainer_client.shared import CliError

__all__ = [
    "TRAIN_SPLIT",
    "SFTExample",
    "examples_from_records",
    "load_gold",
    "read_trajectories",
    "refuse_held_out",
    "replay_gold",
    "task_key",
    "training_rows",
    "verl_parquet_rows",
]

TRAIN_SPLIT = "train"
_TOKEN_FIELDS = ("prompt_ids", "response_ids", "response_mask")


@dataclass
class SFTExample:
    """One trajectory to learn from: the prompt (never learned), the response and its loss mask;
    ``key`` names its task (``task_key``)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    messages: list[dict[str, Any]]
    task: str | None
    source: str
    reward: float
    key: str = ""

    @property
    def model_tokens(self) -> int:
        return sum(self.response_mask)


def task_key(messages: Sequence[dict[str, Any]], ground_truth: Any) -> str:
    """What identifies a task across files: its last user message and its ground truth."""
    user = next((m.get("content") for m in reversed(messages) if m.get("role") == "user"), None)
    return orjson.dumps([user, ground_truth], default=str, option=orjson.OPT_SORT_KEYS).decode()


def refuse_held_out(examples: Sequence[SFTExample], path: str | None) -> None:
    """A ``CliError`` when an example is of a task of the held-out split ``path`` (None: no check)."""
    if path is None:
        return
    from trainer_client.rollout.dataset import load_tasks

    held = {task_key(row.messages, row.ground_truth) for row in load_tasks(path)}
    leaked = [e for e in examples if e.key in held]
    if leaked:
        raise CliError(
            f"{leaked[0].source}: {len(leaked)} trajectories are of tasks of the held-out split {path} "
            f"(first: {leaked[0].task or leaked[0].key[:80]}); held-out tasks must stay unseen"
        )


def _task_of(record: dict[str, Any]) -> str | None:
    truth = record.get("ground_truth")
    return str(truth["task"]) if isinstance(truth, dict) and "task" in truth else None


def examples_from_records(
    records: Sequence[dict[str, Any]], *, min_reward: float, source: str
) -> list[SFTExample]:
    """The records whose reward reaches ``min_reward``, as examples; a ``CliError`` (one line) when
    there are none, or a record lacks the token ids a rollout JSONL carries."""
    if not records:
        raise CliError(f"{source}: no trajectories in it")
    examples = []
    for number, record in enumerate(records):
        missing = [k for k in _TOKEN_FIELDS if not isinstance(record.get(k), list)]
        if missing:
            raise CliError(
                f"{source}: record {number} has no {', '.join(missing)}; give a trainer-client rollout JSONL"
            )
        if len(record["response_ids"]) != len(record["response_mask"]):
            raise CliError(
                f"{source}: record {number} has response_ids and response_mask of different lengths"
            )
        reward = record.get("reward")
        if reward is None or float(reward) < min_reward or not any(record["response_mask"]):
            continue
        examples.append(
            SFTExample(
                prompt_ids=[int(i) for i in record["prompt_ids"]],
                response_ids=[int(i) for i in record["response_ids"]],
                response_mask=[int(m) for m in record["response_mask"]],
                messages=list(record.get("messages") or []),
                task=_task_of(record),
                source=source,
                reward=float(reward),
                key=task_key(_prompt_messages(record), record.get("ground_truth")),
            )
        )
    if not examples:
        rewards = [float(r["reward"]) for r in records if r.get("reward") is not None]
        best = f"best {max(rewards):g}" if rewards else "none was scored"
        errors = [r["error"] for r in records if r.get("error")]
        why = f"; first error: {errors[0]}" if errors else ""
        raise CliError(
            f"{source}: none of its {len(records)} trajectories reaches reward {min_reward:g} ({best}){why}"
        )
    return examples


def _prompt_messages(record: dict[str, Any]) -> list[dict[str, Any]]:
    messages = list(record.get("messages") or [])
    count = record.get("num_prompt_messages")
    return messages[:count] if isinstance(count, int) else messages


def read_trajectories(path: str) -> list[dict[str, Any]]:
    """The records of a rollout JSONL (a one-line error when the file is missing)."""
    if not Path(path).expanduser().is_file():
        raise CliError(f"trajectories file {path} not found")
    return list(read_records(path))


def load_gold(path: str) -> dict[str, list[str]]:
    """Gold turns by task id from a ``tools.data.gold`` JSONL."""
    if not Path(path).expanduser().is_file():
        raise CliError(f"gold file {path} not found (write one with tools.data.gold.write_gold)")
    gold: dict[str, list[str]] = {}
    for number, entry in enumerate(read_records(path)):
        turns = entry.get("turns") if isinstance(entry, dict) else None
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("task"), str)
            or not isinstance(turns, list)
        ):
            raise CliError(f'{path}: entry {number} is not {{"task": ID, "turns": [TEXT, ...]}}')
        if not all(isinstance(t, str) for t in turns) or not turns:
            raise CliError(f"{path}: entry {number} must have a non-empty list of turn texts")
        gold[entry["task"]] = turns
    if not gold:
        raise CliError(f"{path}: no gold turns in it")
    return gold


def training_rows(rows: Iterable[TaskRow], source: str) -> list[TaskRow]:
    """``rows``, all of the training split; a held-out (or unsplit) row is an error, never data."""
    rows = list(rows)
    for row in rows:
        split = row.extra_info.get("split")
        if split != TRAIN_SPLIT:
            raise CliError(
                f"{source}: row {row.index} (task {row.extra_info.get('task')!r}) is of split {split!r}; "
                "gold is replayed on training rows only (held-out tasks must stay unseen)"
            )
    return rows


async def replay_gold(
    config: Any, rows: Sequence[TaskRow], gold: dict[str, list[str]], *, client: Any = None
) -> list[dict[str, Any]]:
    """The rollout records of ``rows``' gold turns replayed against the tool server (rows without
    gold are skipped; ``client``: a ``ToolClient`` to reuse, else one for ``config.server``)."""
    from trainer_client.cli.generators import scripted_backend
    from trainer_client.client.tool_client import ToolClient
    from trainer_client.rollout.core import RolloutCore
    from trainer_client.rollout.runner import rollout_rows, tool_chooser

    rows = training_rows(rows, str(config.train_data))
    chosen = [row for row in rows if row.extra_info.get("task") in gold]
    if not chosen:
        raise CliError(f"{config.gold}: none of its tasks is a row of {config.train_data}")
    owned = client is None
    client = client or ToolClient(config.server, toolset=config.toolset)
    try:
        health = await client.check_health()
        if not any(health.values()):
            raise CliError(
                f"cannot reach the tool server at {', '.join(config.server)} (start one: tool-server serve)"
            )
        rollout = config.rollout_config()
        script = {row.index: gold[row.extra_info["task"]] for row in chosen}
        tokenizer, generator, renderer, session_for = scripted_backend(
            argparse.Namespace(model=config.model), rollout, script
        )
        core = RolloutCore(tokenizer, generator, client, rollout, verifier=client, renderer=renderer)
        tools_for = await tool_chooser(client, core, config.tool_schemas, config.toolset)
        return await rollout_rows(
            core,
            chosen,
            1,
            verifier=config.verifier,
            concurrency=config.max_concurrency,
            on_record=lambda record: None,
            tools_for=tools_for,
            session_for=session_for,
        )
    finally:
        if owned:
            await client.aclose()


def shuffled(examples: Sequence[SFTExample], seed: int, epoch: int) -> list[SFTExample]:
    order = list(examples)
    random.Random(f"{seed}:sft:{epoch}").shuffle(order)
    return order


def verl_parquet_rows(examples: Sequence[SFTExample]) -> list[dict[str, Any]]:
    """Rows for veRL's multi-turn SFT trainer: ``messages`` (role and text, what veRL's own
    ``MultiTurnSFTDataset`` renders) and our token-exact ``input_ids`` and ``loss_mask`` (prompt 0,
    then the response mask), which ``trainer_client.verl.sft_dataset.TokenSFTDataset`` reads."""
    rows = []
    for e in examples:
        messages = [{"role": str(m.get("role")), "content": _text(m.get("content"))} for m in e.messages]
        rows.append(
            {
                "messages": messages,
                "input_ids": e.prompt_ids + e.response_ids,
                "loss_mask": [0] * len(e.prompt_ids) + e.response_mask,
                "task": e.task or "",
                "reward": e.reward,
            }
        )
    return rows


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return "" if content is None else str(content)
