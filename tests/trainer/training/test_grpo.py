"""The local GRPO trainer: its exact shared-prefix computations, veRL's losses on our
masks, and a 2-step smoke run of ``trainer-client train`` (then a resumed third step)
against a real tool server with the real SmolLM2 model."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.require import require

require("verl")

from tests.support.server import REPO, running_server, server_config  # noqa: E402
from trainer_client.backends.hf_prefix import (  # noqa: E402
    SharedPrefixGenerator,
    common_prefix_length,
    prompt_prefix,
    use_gqa_decode_attention,
)
from trainer_client.rollout.core import StopReason, Trajectory  # noqa: E402
from trainer_client.training.grpo import (  # noqa: E402
    GRPOConfig,
    GRPOTrainer,
    RolloutBatch,
    _kind,
    actor_loss_config,
    grpo_advantages,
    policy_loss_terms,
    task_from_row,
)
from trainer_client.training.logprobs import response_logprobs, shared_prefix  # noqa: E402


@pytest.fixture(scope="module")
def smol() -> tuple[Any, Any]:
    from trainer_client.backends.models import load_model

    torch.set_num_threads(1)
    return load_model("smollm2")


def prompts_sharing_a_prefix(tokenizer: Any) -> list[list[int]]:
    system = {"role": "system", "content": "You are a careful calculator. " * 8}
    return [
        list(
            tokenizer.apply_chat_template(
                [system, {"role": "user", "content": q}], add_generation_prompt=True
            )["input_ids"]
        )
        for q in ("What is 12 * 34?", "Compute 981 times 17, please.", "Hi")
    ]


def test_common_prefix_length() -> None:
    assert common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_length([[5, 6], [7]]) == 0
    assert common_prefix_length([]) == 0


@pytest.mark.parametrize("sharing", [False, True], ids=["plain", "shared-prefix"])
def test_logprobs_equal_separate_forward_passes(smol: tuple[Any, Any], sharing: bool) -> None:
    """Both computations behind ``response_logprobs`` (every row in full, or after a
    shared prefix computed once) give each row's own forward-pass log-probs."""
    tokenizer, model = smol
    prompts = prompts_sharing_a_prefix(tokenizer)
    ids = prompt_prefix(prompts)
    assert ids is not None and len(ids) == common_prefix_length(prompts)
    prefix = shared_prefix(model, ids) if sharing else None
    responses = [[28, 1, 44, 55, 2], [90, 91], [5, 6, 7, 8, 9, 10, 11]]
    log_prob, entropy = response_logprobs(
        model, prompts, responses, pad_token_id=2, with_entropy=True, temperature=0.7, prefix=prefix
    )
    assert log_prob.shape == entropy.shape == (3, 7)
    with torch.no_grad():
        for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
            logits = model(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1 : -1].float() / 0.7
            expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r)[:, None])[:, 0]
            assert torch.allclose(log_prob[i, : len(r)], expected, atol=1e-4)
            assert torch.all(log_prob[i, len(r) :] == 0) and torch.all(entropy[i, len(r) :] == 0)


def test_a_prefix_the_prompts_do_not_share_is_refused(smol: tuple[Any, Any]) -> None:
    tokenizer, model = smol
    prompts = prompts_sharing_a_prefix(tokenizer)
    prefix = shared_prefix(model, prompts[0][:-1])  # longer than what the others share
    with pytest.raises(ValueError, match="shared prefix"):
        response_logprobs(model, prompts, [[1], [2], [3]], pad_token_id=2, prefix=prefix)
    assert prompt_prefix([[1, 2, 3], [1, 2, 4]]) is None, "2 shared tokens are not worth a prefix"


def test_gradients_flow_through_the_shared_prefix(smol: tuple[Any, Any]) -> None:
    tokenizer, model = smol
    prompts = prompts_sharing_a_prefix(tokenizer)[:2]
    prefix = shared_prefix(model, prompt_prefix(prompts))
    log_prob, _ = response_logprobs(model, prompts, [[28, 1], [90]], pad_token_id=2, prefix=prefix)
    log_prob.sum().backward()
    embed = model.get_input_embeddings().weight.grad
    first_prompt_token = prompts[0][0]
    assert embed is not None and embed[first_prompt_token].abs().sum() > 0
    model.zero_grad(set_to_none=True)


def test_one_prefix_backward_per_step_gives_the_same_gradient(smol: tuple[Any, Any]) -> None:
    """Micro-batches that reuse one detached prefix, plus ``prefix.backward()`` once,
    accumulate exactly the gradient of back-propagating through the prefix every time."""
    tokenizer, model = smol
    prompts = prompts_sharing_a_prefix(tokenizer)
    responses = [[28, 1, 44], [90, 91], [5, 6, 7, 8]]
    name, param = (
        "model.layers.0.self_attn.k_proj.weight",
        model.get_parameter("model.layers.0.self_attn.k_proj.weight"),
    )

    model.zero_grad(set_to_none=True)
    for i in range(3):  # three micro-batches of one row, each computing its own prefix
        log_prob, _ = response_logprobs(model, prompts[i : i + 1] * 2, [responses[i]] * 2, pad_token_id=2)
        log_prob.sum().backward()
    expected = param.grad.clone()

    model.zero_grad(set_to_none=True)
    shared = common_prefix_length(prompts)
    prefix = shared_prefix(model, prompts[0][:shared], detach=True)
    for i in range(3):
        log_prob, _ = response_logprobs(
            model, prompts[i : i + 1] * 2, [responses[i]] * 2, pad_token_id=2, prefix=prefix
        )
        log_prob.sum().backward()
    assert param.grad is None or not torch.allclose(param.grad, expected, atol=1e-6), (
        "prefix part still missing"
    )
    prefix.backward()
    assert torch.allclose(param.grad, expected, rtol=1e-3, atol=1e-5), name
    model.zero_grad(set_to_none=True)


def test_shared_prefix_generator_matches_the_plain_hf_backend(smol: tuple[Any, Any]) -> None:
    from trainer_client.backends.hf import HFGenerator

    tokenizer, model = smol
    prompts = prompts_sharing_a_prefix(tokenizer)
    params = {"temperature": 0, "max_tokens": 12, "logprobs": True}

    async def generate(cls: type) -> tuple[list[Any], Any]:
        generator = cls(model, tokenizer, max_batch_size=4)
        try:
            outputs = await asyncio.gather(
                *(
                    generator.generate(str(i), prompt_ids=p, sampling_params=params)
                    for i, p in enumerate(prompts)
                )
            )
        finally:
            await generator.aclose()
        return outputs, generator

    plain, _ = asyncio.run(generate(HFGenerator))
    assert use_gqa_decode_attention(model)
    shared, generator = asyncio.run(generate(SharedPrefixGenerator))
    assert generator.prefix_tokens_reused > 0
    for a, b in zip(plain, shared, strict=True):
        assert a.token_ids == b.token_ids
        assert a.stop_reason == b.stop_reason
        assert max(abs(x - y) for x, y in zip(a.log_probs, b.log_probs, strict=True)) < 1e-3


def trajectory(response_mask: list[int], reward: float) -> Trajectory:
    return Trajectory(
        prompt_ids=[1, 2, 3],
        response_ids=list(range(10, 10 + len(response_mask))),
        response_mask=response_mask,
        response_logprobs=[0.0] * len(response_mask),
        num_turns=3,
        stop_reason=StopReason.ANSWER,
        session_id="s",
        messages=[],
        reward_score=reward,
    )


def test_grpo_advantage_and_loss_ignore_observation_tokens() -> None:
    mask = [1, 1, 0, 0, 1]  # model, model, tool, tool, model
    batch = RolloutBatch.build(
        [trajectory(mask, 1.0), trajectory(mask, 0.0), trajectory(mask[:3], 0.5), trajectory(mask[:3], 0.5)],
        [0, 0, 1, 1],
    )
    advantages = grpo_advantages(batch)
    assert torch.all(advantages[batch.response_mask == 0] == 0)
    assert advantages[0, 0] > 0 > advantages[1, 0]
    assert torch.all(advantages[2:] == 0), "a group with equal rewards carries no signal"

    config = GRPOConfig(train_data="x", kl_coef=0.1)
    actor = actor_loss_config(config, batch_num_tokens=int(batch.response_mask.sum()), global_batch_size=4)
    # Small, seeded log-ratios: low_var_kl clamps its value at 10, and a clamped token has
    # no gradient (veRL's behaviour, not a masking fault).
    generator = torch.Generator().manual_seed(0)
    log_prob = (0.1 * torch.randn(batch.response_mask.shape, generator=generator)).requires_grad_(True)
    ref = 0.1 * torch.randn(batch.response_mask.shape, generator=generator)
    loss, metrics = policy_loss_terms(
        log_prob=log_prob,
        old_log_prob=log_prob.detach(),
        advantages=advantages,
        response_mask=batch.response_mask,
        actor_config=actor,
        ref_log_prob=ref,
    )
    loss.backward()
    assert torch.all(log_prob.grad[batch.response_mask == 0] == 0)
    assert torch.all(log_prob.grad[batch.response_mask == 1] != 0)
    assert metrics["kl_loss"] > 0 and "pg_clipfrac" in metrics


def tiny_dataset(tmp_path: Path) -> Path:
    from tools.data import arithmetic, write_parquet

    return write_parquet(
        arithmetic.build_rows(n_train=2, n_test=0, seed=0)["train"], tmp_path / "train.parquet"
    )


def test_one_update_makes_the_rewarded_response_more_likely(smol: tuple[Any, Any], tmp_path: Path) -> None:
    """The trainer's real update step on a fixed group of two answers to one prompt, one
    rewarded: the policy must prefer the rewarded answer more than before. A sign error in
    the advantages or the loss, or an update that never reaches the weights, fails this."""
    tokenizer, model = smol
    prompt = list(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "What is 12 * 34?"}], add_generation_prompt=True
        )["input_ids"]
    )
    good, bad = (tokenizer(text, add_special_tokens=False)["input_ids"] for text in ("408", "512"))
    rows = [
        replace(trajectory([1] * len(ids), reward), prompt_ids=prompt, response_ids=ids)
        for ids, reward in ((good, 1.0), (bad, 0.0))
    ]
    batch = RolloutBatch.build(rows, [0, 0])

    # The trainer as constructed, nothing patched in: its own model, optimizer and generator.
    trainer = GRPOTrainer(
        GRPOConfig(train_data=str(tiny_dataset(tmp_path)), lr=1e-5, out_dir=str(tmp_path / "run"))
    )

    def margin() -> float:
        with torch.no_grad():
            log_prob, _ = response_logprobs(trainer.model, [prompt, prompt], [good, bad], pad_token_id=2)
        return float(log_prob[0].sum() - log_prob[1].sum())

    before = margin()
    metrics = trainer.update(batch, grpo_advantages(batch))
    assert metrics["trained_rows"] == 2 and metrics["grad_norm"] > 0
    assert margin() > before + 0.1, "the update did not move the policy towards the rewarded answer"
    asyncio.run(trainer.close())


def test_config_errors_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="group_size"):
        GRPOConfig(train_data="x", group_size=1)
    with pytest.raises(ValueError, match="unknown GRPO config keys"):
        GRPOConfig.from_dict({"train_data": "x", "learning_rate": 1e-5})


def test_task_from_a_builder_row() -> None:
    from tools.data import arithmetic

    row = arithmetic.build_rows(n_train=0, n_test=1, seed=3)["test"][0]
    task = task_from_row(row)
    assert task.messages == row["prompt"]
    assert task.ground_truth == row["reward_model"]["ground_truth"]
    assert task.metadata["kind"] == row["extra_info"]["kind"]


# --------------------------------------------------------------------------- the CLI, end to end


def train(out: Path, url: str, data: Path, steps: int) -> subprocess.CompletedProcess[str]:
    """The same command as the learning run (examples/learn_arithmetic.py), tiny."""
    command = [
        sys.executable, "-m", "trainer_client.cli.command", "train",
        "--server", url,
        "--train-data", str(data / "train.parquet"),
        "--eval-data", str(data / "test.parquet"),
        "--out-dir", str(out),
        "--steps", str(steps),
        "--prompts-per-step", "1",  # one group: KL and entropy give every step a gradient
        "--group-size", "2",
        "--micro-batch-size", "2",
        "--max-turns", "3",
        "--max-tokens-per-turn", "32",
        "--response-length", "96",
        "--temperature", "0.7",
        "--verifier", "weighted",
        "--verifier-args", json.dumps({"verifiers": {"math_equal": 1.0, "format": 0.1}}),
        "--eval-verifier", "math_equal",
        "--eval-size", "1",
        "--eval-every", "2",
        "--save-every", "2",
        "--kl-coef", "0.01",
        "--entropy-coeff", "0.01",
        "--threads", "1",
    ]  # fmt: skip
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.timeout(1800)  # three trainer processes, each loading the model, on a loaded machine
def test_train_two_steps_then_resume(tmp_path: Path) -> None:
    from tools.data import arithmetic, write_parquet

    rows = arithmetic.build_rows(n_train=8, n_test=4, seed=1)
    data = tmp_path / "data"
    for split, split_rows in rows.items():
        write_parquet(split_rows, data / f"{split}.parquet")
    verifiers = [
        {"target": "tools.verifiers.math:math_equal"},
        {"target": "tools.verifiers.format:format_check"},
        {"target": "tools.verifiers.weighted:weighted"},
    ]
    out = tmp_path / "run"
    with running_server(server_config(verifiers=verifiers)) as server:
        first = train(out, server.url, data, steps=2)
        assert first.returncode == 0, first.stderr[-4000:]
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        train_records = [r for r in records if r["split"] == "train"]
        assert [r["step"] for r in train_records] == [1, 2]
        assert [r["step"] for r in records if r["split"] == "eval"] == [0, 2]
        for key in (
            "reward", "kl", "entropy", "response_length", "tool_calls", "tool_errors",
            "rollout_tokens_per_s", "tool_calls_per_s", "pg_loss", "grad_norm",
        ):  # fmt: skip
            assert key in train_records[-1], key
        assert train_records[-1]["entropy"] > 0 and train_records[-1]["rollout_tokens_per_s"] > 0
        assert list((out / "tensorboard").glob("events.out.tfevents.*"))
        assert (out / "reward_curve.png").stat().st_size > 1000
        checkpoint = out / "checkpoints" / "step_000002"
        assert (checkpoint / "trainer_state.pt").is_file() and (checkpoint / "config.json").is_file()
        assert (out / "checkpoints" / "latest").read_text() == "step_000002"
        summary = json.loads(first.stdout[first.stdout.index("{") :])
        # Two steps are too few for success to say anything: learning is asserted by
        # test_one_update_makes_the_rewarded_response_more_likely.
        assert summary["steps"] == 2 and "final_success" in summary

        # the weights moved (the entropy term alone guarantees a gradient)
        from safetensors.torch import load_file

        from trainer_client.backends.models import resolve_model_path

        before = load_file(resolve_model_path("smollm2") / "model.safetensors")
        after = load_file(checkpoint / "model.safetensors")
        name = "model.layers.0.mlp.down_proj.weight"
        assert not torch.equal(before[name], after[name])

        resumed = train(out, server.url, data, steps=3)
        assert resumed.returncode == 0, resumed.stderr[-4000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "train"] == [1, 2, 3]
    assert [r["step"] for r in records if r["split"] == "eval"] == [0, 2, 3], "no second baseline eval"
    assert (out / "checkpoints" / "latest").read_text() == "step_000003"
    kept = sorted(p.name for p in (out / "checkpoints").glob("step_*"))
    assert kept == ["step_000002", "step_000003"]


def test_held_out_success_is_grouped_by_kind_or_environment_level() -> None:
    # environment rows carry a level (extra_info), built-in ones a kind; the learning run's
    # per-level table reads these groups
    from trainer_client.rollout.dataset import TaskRow

    env_row = {
        "prompt": [{"role": "user", "content": "x"}],
        "extra_info": {"pack": "p", "task": "t", "level": 2},
    }
    kind_row = {"prompt": [{"role": "user", "content": "x"}], "extra_info": {"kind": "multiply", "level": 1}}
    plain = {"prompt": [{"role": "user", "content": "x"}]}
    assert [_kind(TaskRow.from_row(r).task()) for r in (env_row, kind_row, plain)] == [
        "level_2",
        "multiply",
        "all",
    ]


@pytest.mark.timeout(1200)  # a model load and a step of generation, beside whatever else the machine runs
def test_one_curriculum_step_on_an_environment_logs_the_time_split_and_levels(tmp_path: Path) -> None:
    """One step of ``trainer-client train --curriculum`` on a procedural bank pack (levels 1-3):
    the step's record splits its time (generate / tools / verify / update), reports reward and
    success per level, and the curriculum drew every prompt from its first level."""
    from tools.data import write_parquet
    from tools.data.env_prompts import MULTI_CALL_FORMAT, few_shot_rows
    from tools.data.environments import build_rows
    from tools.envs.procedural import pack

    arguments = {"world": "bank", "seed": 0, "tasks": 30, "levels": [1, 2, 3], "parameter_expansion": 0.0}
    p = pack(**arguments)
    rows = build_rows(p, seed=0, test_fraction=0.1, levels=[1, 2, 3])
    rows = few_shot_rows(p, rows, 3, [1, 2, 3], 0, example_levels=[1, 2, 3], call_format=MULTI_CALL_FORMAT)
    data = write_parquet(rows["train"], tmp_path / "train.parquet")
    config = server_config(environments=[{"source": "tools.envs.procedural:pack", "arguments": arguments}])
    out = tmp_path / "run"
    command = [
        sys.executable, "-m", "trainer_client.cli.command", "train",
        "--train-data", str(data),
        "--toolset", p.id,
        "--tool-schemas", "none",
        "--out-dir", str(out),
        "--steps", "1",
        "--prompts-per-step", "2",
        "--group-size", "2",
        "--max-turns", "3",
        "--max-tokens-per-turn", "40",
        "--response-length", "160",
        "--temperature", "0.7",
        "--verifier", "tool_use",
        "--curriculum",
        "--save-every", "0",
        "--threads", "1",
        "--no-tensorboard",
        "--no-plot",
    ]  # fmt: skip
    with running_server(config) as server:
        done = subprocess.run(
            [*command, "--server", server.url],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=1100,
            check=False,
        )
    assert done.returncode == 0, done.stderr[-4000:]
    (record,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert record["split"] == "train" and record["step"] == 1
    phases = ["time/generate_s", "time/tools_s", "time/verify_s", "time/rollout_other_s"]
    for key in [*phases, "time/update_s", "time/rollout_s", "time/cpu_s"]:
        assert record[key] >= 0, key
    assert record["time/generate_s"] > 0 and record["time/verify_s"] > 0
    assert 0.1 < record["memory/max_rss_gb"] < 64  # the model alone holds more than 0.1 GB
    # the phases partition the rollout's wall time (none is counted twice)
    assert sum(record[k] for k in phases) <= record["time/rollout_s"] * 1.01 + 0.1
    # the tool server's and client's share: the rollout's time with no generation in flight
    assert record["time/tool_share"] == pytest.approx(
        1 - record["time/generate_s"] / sum(record[k] for k in phases)
    )
    assert record["prompts/level_1"] == 2 and "prompts/level_2" not in record
    assert 0.0 <= record["success/level_1"] <= 1.0 and "reward_of/level_1" in record
    assert record["curriculum/frontier"] in (1.0, 2.0)
    assert "curriculum/window_success/level_1" in record
