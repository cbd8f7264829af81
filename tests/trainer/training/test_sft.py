"""``trainer-client sft``, the supervised warm start: gold turns of a procedural pack's training
split replayed against a real tool server on loopback, rendered and masked by the rollout core
token for token; held-out tasks never in the data; a few steps on the real SmolLM2 lower the
loss; the model directory loads in ``train``; the veRL parquet export; one-line errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.require import require

require("verl")

from tests.support.server import REPO, running_server, server_config  # noqa: E402
from tools.data import write_parquet  # noqa: E402
from tools.data.environments import build_rows  # noqa: E402
from tools.data.gold import gold_script, gold_turns, write_gold  # noqa: E402
from tools.envs.procedural import pack  # noqa: E402
from trainer_client.cli.command import main  # noqa: E402
from trainer_client.rollout.dataset import load_tasks  # noqa: E402
from trainer_client.shared import CliError  # noqa: E402
from trainer_client.training.config import GRPOConfig  # noqa: E402
from trainer_client.training.sft_config import SFTConfig  # noqa: E402
from trainer_client.training.sft_data import (  # noqa: E402
    SFTExample,
    examples_from_records,
    load_gold,
    replay_gold,
    shuffled,
    verl_parquet_rows,
)

ARGUMENTS = {"world": "bank", "seed": 0, "tasks": 24, "levels": [1, 2, 3], "parameter_expansion": 0.0}
# the rollout shape of the GRPO run the warm start precedes (examples/learn_multistep.py's)
SHAPE = {
    "toolset": None,
    "tool_schemas": "none",
    "max_turns": 4,
    "max_calls_per_turn": 4,
    "max_tokens_per_turn": 96,
    "response_length": 448,
    "max_obs_tokens": 128,
}


@dataclass
class Env:
    """A served pack, its splits as parquet, the training split's gold file and its replay."""

    url: str
    pack: Any
    rows: dict[str, list[dict[str, Any]]]
    train: Path
    test: Path
    gold: Path
    config: SFTConfig
    records: list[dict[str, Any]]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    out = tmp_path_factory.mktemp("sft")
    p = pack(**ARGUMENTS)
    # the pack's own prompts (policy and task): few-shot ones would make each SFT step ~5x longer
    rows = build_rows(p, seed=0, test_fraction=0.25, levels=[1, 2, 3])
    train = write_parquet(rows["train"], out / "train.parquet")
    test = write_parquet(rows["test"], out / "test.parquet")
    gold = write_gold(gold_script(p, rows["train"]), out / "gold.jsonl")
    server = server_config(environments=[{"source": "tools.envs.procedural:pack", "arguments": ARGUMENTS}])
    with running_server(server) as running:
        config = SFTConfig(
            gold=str(gold),
            train_data=str(train),
            server=[running.url],
            out_dir=str(out / "sft"),
            verifier="tool_use",
            verifier_arguments={"mode": "eval"},
            threads=1,
            **{**SHAPE, "toolset": p.id},
        )
        records = asyncio.run(replay_gold(config, load_tasks(train), load_gold(str(gold))))
        yield Env(running.url, p, rows, train, test, gold, config, records)


def test_gold_replays_are_the_rollout_paths_trajectories(env: Env, smol_tokenizer: Any) -> None:
    """Each gold replay is the chat template's rendering of its conversation, token for token; the
    model tokens (mask 1) are exactly the gold turns, the observations (mask 0) the server's real
    results; and the replay runs under the GRPO run's own rollout config."""
    from trainer_client.templates.factory import make_renderer

    assert len(env.records) == len(env.rows["train"])
    assert all(r["reward"] == 1.0 for r in env.records), [r["reward"] for r in env.records]
    renderer = make_renderer(smol_tokenizer, None)
    tasks = {t.id: t for t in env.pack.tasks}
    for record in env.records:
        ids = record["prompt_ids"] + record["response_ids"]
        rendered = renderer.codec.encode(
            renderer.render_text(record["messages"], add_generation_prompt=False)
        )
        assert ids == rendered[: len(ids)] and len(rendered) - len(ids) <= 2  # the last turn's close
        turns = gold_turns(env.pack, tasks[record["ground_truth"]["task"]])
        model_text = [s["text"] for s in record["segments"] if s["model"]]
        assert [t.removesuffix("<|im_end|>") for t in model_text] == turns
        observations = [
            m["content"] for m in record["messages"][record["num_prompt_messages"] :] if m["role"] == "tool"
        ]
        assert observations and all(o.startswith("{") for o in observations)  # the world's records
    grpo = GRPOConfig(
        train_data="x", temperature=0.0, top_p=1.0, verifier="tool_use", **{**SHAPE, "toolset": env.pack.id}
    )
    sft = env.config.rollout_config()
    assert replace(sft, sampling_params={}, verifier_arguments={}) == replace(
        grpo.rollout_config(), sampling_params={}, verifier_arguments={}
    )


def test_held_out_tasks_never_reach_the_sft_data(
    env: Env, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    held_out = {r["extra_info"]["task"] for r in env.rows["test"]}
    assert held_out and not held_out & {r["ground_truth"]["task"] for r in env.records}
    with pytest.raises(ValueError, match="training rows only"):
        gold_script(env.pack, env.rows["test"])
    # gold of a held-out task (written by hand), replayed on the held-out split: refused
    sneaked = write_gold(
        [{"task": t, "turns": ["<answer>x</answer>"]} for t in held_out], tmp_path / "g.jsonl"
    )
    with pytest.raises(CliError, match="held-out tasks must stay unseen"):
        asyncio.run(
            replay_gold(
                replace(env.config, train_data=str(env.test)), load_tasks(env.test), load_gold(str(sneaked))
            )
        )
    code = main(
        [
            "sft",
            "--gold",
            str(sneaked),
            "--train-data",
            str(env.test),
            "--server",
            env.url,
            "--out-dir",
            str(tmp_path),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "split 'test'" in err and len(err.strip().splitlines()) == 1
    # the policy's own rollouts (rejection sampling) of a task of --held-out: refused too
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_text("".join(json.dumps(r, default=str) + "\n" for r in env.records[:3]))
    pretend_held_out = write_parquet(env.rows["train"][:1], tmp_path / "held.parquet")
    base = ["sft", "--trajectories", str(rollouts), "--no-train", "--out-dir", str(tmp_path / "rs")]
    assert main([*base, "--held-out", str(pretend_held_out)]) == 2
    err = capsys.readouterr().err
    assert "held-out split" in err and len(err.strip().splitlines()) == 1
    assert main([*base, "--held-out", str(env.test)]) == 0


def test_sft_steps_lower_the_loss_and_train_loads_the_model(env: Env, tmp_path: Path) -> None:
    from trainer_client.training.grpo import GRPOTrainer
    from trainer_client.training.sft import SFTTrainer

    examples = examples_from_records(env.records, min_reward=1.0, source="gold")[:2]
    config = replace(
        env.config, out_dir=str(tmp_path / "sft"), epochs=2, batch_size=2, lr=1e-4, dtype="float32"
    )
    trainer = SFTTrainer(config, examples)
    summary = trainer.train()
    assert summary["steps"] == 2 and summary["loss_after"] < 0.8 * summary["loss_before"], summary
    model_dir = Path(summary["model_dir"])
    assert (model_dir / "config.json").is_file()
    # the packaged SmolLM2's repaired tokenizer travels with it (its turns end with <|im_end|>)
    from trainer_client.backends.models import load_tokenizer

    saved, packaged = load_tokenizer(str(model_dir)), load_tokenizer("smollm2")
    assert (saved.eos_token_id, saved.chat_template) == (packaged.eos_token_id, packaged.chat_template)
    # prompts and observations carry no loss: changing an observation token changes no gradient target
    assert all(e.model_tokens < len(e.response_ids) for e in examples)

    grpo = GRPOTrainer(
        GRPOConfig(
            train_data=str(env.train),
            model=str(model_dir),
            out_dir=str(tmp_path / "grpo"),
            server=[env.url],
            threads=1,
        )
    )
    try:
        for (name, loaded), saved in zip(
            grpo.model.named_parameters(), trainer.model.parameters(), strict=True
        ):
            assert torch.equal(loaded, saved), name
    finally:
        asyncio.run(grpo.close())


def test_max_steps_takes_the_first_batches_of_the_seeded_order(env: Env, tmp_path: Path) -> None:
    """``--max-steps``: the same warm start on any machine (``--max-minutes`` stops where the clock
    says): the first N batches of the epochs' seeded order."""
    from trainer_client.training.sft import SFTTrainer

    examples = examples_from_records(env.records, min_reward=1.0, source="gold")[:3]
    config = replace(env.config, out_dir=str(tmp_path / "sft"), epochs=2, batch_size=1, max_steps=4)
    trainer = SFTTrainer(config, examples)
    first, second = shuffled(examples, config.seed, 0), shuffled(examples, config.seed, 1)
    assert trainer.batches() == [[e] for e in first] + [[second[0]]]
    with pytest.raises(ValueError, match="max_steps must be a positive integer"):
        replace(config, max_steps=0)


def test_verl_parquet_export_has_verls_columns(env: Env, tmp_path: Path, smol_tokenizer: Any) -> None:
    """The export holds veRL's ``messages`` column and the token-exact ``input_ids``/``loss_mask``,
    which ``TokenSFTDataset`` hands veRL's SFT trainer as they are (veRL's own option picks it)."""
    import pandas as pd
    from omegaconf import OmegaConf
    from verl.trainer.sft_trainer import create_sft_dataset

    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_text("".join(json.dumps(r, default=str) + "\n" for r in env.records[:3]))
    out = tmp_path / "out"
    code = main(
        [
            "sft",
            "--trajectories",
            str(rollouts),
            "--no-train",
            "--export",
            "verl-parquet",
            "--out-dir",
            str(out),
        ]
    )
    assert code == 0
    frame = pd.read_parquet(out / "sft.parquet")
    assert {"messages", "input_ids", "loss_mask"} <= set(frame.columns) and len(frame) == 3
    assert set(frame["messages"][0][0]) == {"role", "content"}
    data = OmegaConf.create(
        {
            "custom_cls": {"path": "pkg://trainer_client.verl.sft_dataset", "name": "TokenSFTDataset"},
            "pad_mode": "no_padding",
            "max_length": 4096,
            "truncation": "error",
        }
    )
    dataset = create_sft_dataset([str(out / "sft.parquet")], data, smol_tokenizer, None)
    record = env.records[0]
    item = dataset[0]
    assert item["input_ids"].tolist() == record["prompt_ids"] + record["response_ids"]
    assert item["loss_mask"].tolist() == [0] * len(record["prompt_ids"]) + record["response_mask"]
    rows = verl_parquet_rows([SFTExample([1, 2], [3, 4], [1, 0], [], None, "x", 1.0)])
    assert rows[0]["loss_mask"] == [0, 0, 1, 0]


def test_bad_input_gives_a_one_line_error(
    env: Env, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    failed = tmp_path / "failed.jsonl"
    failed.write_text("".join(json.dumps({**r, "reward": 0.25}, default=str) + "\n" for r in env.records[:2]))
    # a training split whose rows name an environment the server does not serve
    unknown_rows = [
        {
            **r,
            "extra_info": {**r["extra_info"], "pack": "nope"},
            "reward_model": {
                "style": "rule",
                "ground_truth": {"pack": "nope", "task": r["extra_info"]["task"]},
            },
        }
        for r in env.rows["train"][:2]
    ]
    unknown = write_parquet(unknown_rows, tmp_path / "unknown.parquet")
    cases = {
        "no trajectories in it": ["--trajectories", str(empty)],
        "none of its 2 trajectories reaches reward 1": ["--trajectories", str(failed)],
        "nope": ["--gold", str(env.gold), "--train-data", str(unknown), "--server", env.url],
        "nothing to learn from": [],
    }
    for expected, argv in cases.items():
        code = main(["sft", *argv, "--out-dir", str(tmp_path / "out"), "--verifier-args", '{"mode": "eval"}'])
        err = capsys.readouterr().err
        assert code == 2, (expected, err)
        assert expected in err and len(err.strip().splitlines()) == 1, err


def multistep_example() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("learn_multistep", REPO / "examples" / "learn_multistep.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_multistep_examples_warm_start_replays_gold_as_its_grpo_run_rolls_out(tmp_path: Path) -> None:
    """``learn_multistep.py --warm-start``: ``sft`` gets the GRPO run's rollout flags (so the gold is
    spliced and cut as that run's rollouts), and ``train`` starts from the warm start's model."""
    import argparse

    from trainer_client.cli import sft as sft_cli
    from trainer_client.cli import train as train_cli

    module = multistep_example()
    args = module.build_parser().parse_args(["--warm-start", "--out", str(tmp_path)])
    url, train, test = "http://127.0.0.1:1", tmp_path / "train.parquet", tmp_path / "test.parquet"

    def parsed(configure: Any, argv: list[str]) -> argparse.Namespace:
        parser = argparse.ArgumentParser()
        configure(parser)
        return parser.parse_args(argv[1:])

    sft = sft_cli.config_from_args(
        parsed(sft_cli.configure, module.sft_argv(args, url, "pack-x", train, test))
    )
    grpo = train_cli.config_from_args(
        parsed(train_cli.configure, module.train_argv(args, url, "pack-x", train, test))
    )
    assert replace(sft.rollout_config(), sampling_params={}, verifier_arguments={}) == replace(
        grpo.rollout_config(), sampling_params={}, verifier_arguments={}
    )
    assert sft.rollout_config().sampling_params["max_tokens"] == grpo.max_tokens_per_turn
    assert sft.gold == str(tmp_path / "data" / "gold.jsonl") and sft.train_data == str(train)
    assert sft.held_out == str(test)
    assert grpo.model == str(tmp_path / "sft" / "model")


def test_the_multistep_warm_start_learns_only_the_levels_it_is_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--warm-start-levels 1``: the gold file holds level-1 training tasks only (levels 2-3 are
    left to GRPO), all of them; ``--sft-examples N`` caps what sft learns from; a level the pack
    does not have is a one-line argparse error."""
    module = multistep_example()
    argv = ["--warm-start", "--warm-start-levels", "1", "--sft-examples", "32", "--sft-steps", "3"]
    argv += ["--out", str(tmp_path)]
    args = module.build_parser().parse_args(argv)
    pack_id, train, test = module.build_data(args)
    sft = module.sft_argv(args, "http://127.0.0.1:1", pack_id, train, test)
    assert sft[sft.index("--max-examples") + 1] == "32" and sft[sft.index("--max-steps") + 1] == "3"
    levels = {r.extra_info["task"]: r.extra_info["level"] for r in load_tasks(str(train))}
    gold = [json.loads(line)["task"] for line in module.gold_path(args).read_text().splitlines()]
    assert gold and {levels[t] for t in gold} == {1}
    assert len(gold) == sum(level == 1 for level in levels.values())

    with pytest.raises(SystemExit):
        module.build_parser().parse_args(["--warm-start-levels", "4"])
    assert "levels among [1, 2, 3]" in capsys.readouterr().err
