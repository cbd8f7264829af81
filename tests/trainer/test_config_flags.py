"""``trainer-client train`` flags come from ``GRPOConfig``: one place for names, defaults and help."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field

import pytest

from trainer_client.cli.flags import add_dataclass_flags, field_docs, given_values
from trainer_client.cli.train import config_from_args, configure
from trainer_client.training.config import GRPOConfig


def train_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="train")
    configure(parser)
    return parser


def test_every_config_field_is_documented_and_has_a_flag() -> None:
    docs = field_docs(GRPOConfig)
    names = [f.name for f in dataclasses.fields(GRPOConfig)]
    assert sorted(docs) == sorted(names), f"fields without a doc: {sorted(set(names) - set(docs))}"
    text = train_parser().format_help()
    for name in names:
        assert "--" + name.replace("_", "-") in text, name
    assert "rollouts per prompt: the GRPO group (default: 8)" in " ".join(text.split())


def test_flags_build_the_same_config_as_the_dataclass(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("TOOLFACTORY_URL", raising=False)
    args = train_parser().parse_args(
        [
            "--train-data", "t.parquet",
            "--server", "http://a:1", "--server", "http://b:2",
            "--steps", "7",
            "--lr", "3e-5",
            "--betas", "0.8", "0.9",
            "--no-norm-adv-by-std",
            "--greedy-eval",
            "--verifier-args", '{"normalize": true}',
            "--eval-verifier-arguments", '{"k": 1}',
            "--threads", "2",
        ]
    )  # fmt: skip
    config = config_from_args(args)
    assert config == GRPOConfig(
        train_data="t.parquet",
        server=["http://a:1", "http://b:2"],
        steps=7,
        lr=3e-5,
        betas=(0.8, 0.9),
        norm_adv_by_std=False,
        greedy_eval=True,
        verifier_arguments={"normalize": True},
        eval_verifier_arguments={"k": 1},
        threads=2,
    )


def test_flags_override_the_config_file_and_unset_flags_keep_it(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TOOLFACTORY_URL", "http://env:1,http://env:2")
    path = tmp_path / "run.yaml"
    path.write_text("train_data: t.parquet\nsteps: 3\ngroup_size: 4\nresume: false\n")
    config = config_from_args(train_parser().parse_args(["--config", str(path), "--steps", "9"]))
    assert (config.steps, config.group_size, config.resume) == (9, 4, False)
    assert config.server == ["http://env:1", "http://env:2"]


def test_bad_flag_values_are_clear_errors(capsys) -> None:
    with pytest.raises(SystemExit):
        train_parser().parse_args(["--train-data", "t", "--verifier-args", "{not json"])
    assert "not JSON" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--train-data"):
        config_from_args(train_parser().parse_args(["--steps", "2"]))


def test_a_field_type_without_a_flag_is_refused() -> None:
    @dataclass
    class Odd:
        name: str = "x"
        """a name"""
        shape: set[int] = field(default_factory=set)
        """no flag can say this"""

    with pytest.raises(TypeError, match="Odd.shape"):
        add_dataclass_flags(argparse.ArgumentParser(), Odd)
    parser = argparse.ArgumentParser()
    add_dataclass_flags(parser, Odd, skip=["shape"])
    assert given_values(parser.parse_args([]), Odd) == {}
    assert given_values(parser.parse_args(["--name", "y"]), Odd) == {"name": "y"}


def test_train_and_sft_document_each_shared_field_once() -> None:
    """The policy's and the rollout's fields are ``PolicyRunConfig``'s: both commands show the same
    doc for each, every field of ``sft`` has one, and sft keeps its own defaults."""
    from trainer_client.training.policy_run_config import PolicyRunConfig
    from trainer_client.training.sft_config import SFTConfig

    shared = {f.name for f in dataclasses.fields(PolicyRunConfig)}
    grpo_docs, sft_docs = field_docs(GRPOConfig), field_docs(SFTConfig)
    assert shared <= set(grpo_docs) and shared <= set(sft_docs)
    assert {name: grpo_docs[name] for name in shared} == {name: sft_docs[name] for name in shared}
    assert sorted(sft_docs) == sorted(f.name for f in dataclasses.fields(SFTConfig))
    sft = SFTConfig(gold="gold.jsonl", train_data="train.parquet")
    assert (sft.verifier, sft.lr, sft.max_concurrency) == ("tool_use", 2e-5, 32)
    assert GRPOConfig(train_data="t").verifier == "math_equal"
