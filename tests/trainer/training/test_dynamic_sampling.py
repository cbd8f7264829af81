"""``max_num_gen_batches``: DAPO's dynamic sampling. A step rolls out more prompts while too few
groups have a reward spread, and the update takes only groups with one.

The trainer is real (the tiny model of ``tests/support/tiny_policy.py``); its rollout core is
replaced by a script of rewards, so what is tested is the step's sampling and batching."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.support.require import require

require("verl")

from tests.support.tiny_policy import one_group, tiny_model_dir, trainer_on  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("tiny"))


class ScriptedRollouts:
    """Stands in for the rollout core's run_batch: each ``run_batch`` answers the next batch of
    rewards (one reward per row, in order) with real trajectories of the tiny model's tokenizer."""

    def __init__(self, tokenizer: Any, batches: Sequence[Sequence[float]]) -> None:
        self.tokenizer = tokenizer
        self.batches = list(batches)
        self.asked: list[int] = []  # rows asked for, per call

    async def run_batch(self, tasks: list[Any], max_concurrency: int) -> list[Any]:
        rewards = self.batches.pop(0)
        assert len(rewards) == len(tasks), "the script's batch does not fit the step's"
        self.asked.append(len(tasks))
        answers = [(f"answer {i}", reward) for i, reward in enumerate(rewards)]
        return one_group(self.tokenizer, answers).trajectories


def step_with(
    tiny: Path, tmp_path: Path, batches: Sequence[Sequence[float]], **config: Any
) -> tuple[dict, list]:
    # no tool schemas: the step never asks a server (there is none)
    with trainer_on(
        tiny, tmp_path, prompts_per_step=2, group_size=2, tool_schemas="none", **config
    ) as trainer:
        script = ScriptedRollouts(trainer.tokenizer, batches)
        trainer.train_core.run_batch = script.run_batch  # the real core, its rollouts scripted
        record = asyncio.run(trainer.train_step())
    return record, script.asked


def test_a_step_draws_again_until_enough_groups_have_a_spread(tiny: Path, tmp_path: Path) -> None:
    # batch 1: one group with a spread of two; batch 2: another one -> enough, no third draw
    record, asked = step_with(
        tiny,
        tmp_path,
        [[1.0, 1.0, 0.0, 1.0], [0.5, 0.5, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]],
        max_num_gen_batches=3,
    )
    assert asked == [4, 4]
    assert record["gen_batches"] == 2 and record["groups_with_signal"] == 2
    # the update holds the two groups with a spread, not the equal-reward ones
    assert record["trained_groups"] == 2 and record["trained_rows"] == 4
    assert record["grad_norm"] > 0


def test_the_update_takes_at_most_prompts_per_step_groups(tiny: Path, tmp_path: Path) -> None:
    record, asked = step_with(tiny, tmp_path, [[1.0, 0.0, 0.0, 1.0]], max_num_gen_batches=3)
    assert asked == [4] and record["gen_batches"] == 1 and record["trained_groups"] == 2
    record, asked = step_with(
        tiny, tmp_path / "b", [[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]], max_num_gen_batches=2
    )
    # no spread anywhere after the last draw: the update sees every group, which carry no gradient
    assert asked == [4, 4] and record["groups_with_signal"] == 0
    assert record["trained_rows"] == 0 and record["grad_norm"] == 0


def test_without_dynamic_sampling_one_batch_and_every_group(tiny: Path, tmp_path: Path) -> None:
    record, asked = step_with(tiny, tmp_path, [[1.0, 1.0, 0.0, 1.0]])
    assert asked == [4] and record["gen_batches"] == 1
    assert record["groups_with_signal"] == 1 and record["trained_groups"] == 2
    assert record["trained_rows"] == 2  # the rows of the group with a spread


def test_max_num_gen_batches_must_be_positive(tiny: Path, tmp_path: Path) -> None:
    from trainer_client.training.config import GRPOConfig

    with pytest.raises(ValueError, match="max_num_gen_batches"):
        GRPOConfig(train_data="x.parquet", max_num_gen_batches=0)
