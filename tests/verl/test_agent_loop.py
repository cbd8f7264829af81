"""The veRL agent-loop plug-in, end to end on CPU with veRL's own code.

veRL's ``AgentLoopWorker`` is built from veRL's real Hydra config (``ppo_trainer``) with
the agent-loop YAML that ``trainer_client.verl.config`` writes; its server manager is the CPU HF
backend running SmolLM2-135M (greedy). Two real tool servers: one with the calculator,
one whose ``calculator`` answers off by one. Each prompt runs once through each (two
agent-loop names, chosen per sample with veRL's ``agent_name`` column), so the only
difference inside a GRPO group is the tool result.

The worker's own post-processing turns the outputs into a ``DataProto``; then veRL's
``compute_grpo_outcome_advantage`` and ``compute_policy_loss_vanilla`` run on it with
``response_mask``. Checked: tool tokens are present and masked, they get zero
advantage and zero gradient of the loss, the reward is the in-loop ``/v1/verify`` score
and it changes with the tool result, the rollout log-probs equal the policy's log-probs
recomputed on veRL's padded layout (so the token splice is what the trainer sees).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.require import require

require("verl")
require("fastapi")  # veRL's agent loop imports it without declaring it

from tests.support.server import REPO, running_server, server_config  # noqa: E402

VERIFIERS = [{"target": "tools.verifiers.math:math_equal"}, {"target": "tools.verifiers.match:exact_match"}]
WRONG_TOOLS = [
    {"target": "tests.verl.tools_for_tests:off_by_one_calculator", "toolsets": ["default", "math"]}
]
PROMPT_LENGTH = 704
RESPONSE_LENGTH = 160


@pytest.fixture(scope="module")
def servers() -> Any:
    with (
        running_server(server_config(verifiers=VERIFIERS)) as good,
        running_server(server_config(tools=WRONG_TOOLS, verifiers=VERIFIERS)) as wrong,
    ):
        yield good.url, wrong.url


def verl_config(agent_loop_yaml: Path, model_path: Path) -> Any:
    """veRL's own ppo_trainer config, composed with Hydra, pointing at our agent loops."""
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(
            "ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={model_path}",
                "actor_rollout_ref.rollout.name=vllm",
                f"actor_rollout_ref.rollout.prompt_length={PROMPT_LENGTH}",
                f"actor_rollout_ref.rollout.response_length={RESPONSE_LENGTH}",
                "actor_rollout_ref.rollout.temperature=0",
                "actor_rollout_ref.rollout.calculate_log_probs=True",
                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agent_loop_yaml}",
                "actor_rollout_ref.rollout.agent.default_agent_loop=toolfactory",
            ],
        )


def arithmetic_batch(n_prompts: int) -> Any:
    """A veRL input batch: each prompt twice, once per agent loop (good / wrong calculator)."""
    from verl import DataProto

    from tools.data import arithmetic

    rows = arithmetic.build_rows(n_train=0, n_test=64, seed=7)["test"]
    rows = [r for r in rows if r["extra_info"]["kind"] == "multiply"][:n_prompts]
    samples = [(row, agent) for row in rows for agent in ("toolfactory", "toolfactory_wrong")]

    def column(values: list[Any]) -> np.ndarray:
        array = np.empty(len(values), dtype=object)
        array[:] = values
        return array

    return DataProto.from_dict(
        non_tensors={
            "raw_prompt": column([row["prompt"] for row, _ in samples]),
            "reward_model": column([row["reward_model"] for row, _ in samples]),
            "extra_info": column([row["extra_info"] for row, _ in samples]),
            "data_source": column([row["data_source"] for row, _ in samples]),
            "agent_name": column([agent for _, agent in samples]),
            "index": column([row["extra_info"]["index"] for row, _ in samples]),
        }
    )


@pytest.fixture(scope="module")
def rollout(servers: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One batch through veRL's AgentLoopWorker; the DataProto and the policy model."""
    import torch
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    from trainer_client.backends.hf import HFGenerator
    from trainer_client.backends.models import load_model, resolve_model_path
    from trainer_client.verl.config import LoopSettings, write_agent_loop_yaml

    torch.set_num_threads(1)  # the fastest setting on a shared 2-core machine
    good, wrong = servers
    common = {"format": "hermes", "verifier": "math_equal", "max_turns": 3, "max_tokens_per_turn": 48}
    path = write_agent_loop_yaml(
        tmp_path_factory.mktemp("verl") / "agent_loop.yaml",
        [LoopSettings(server_urls=(good,), **common), LoopSettings(server_urls=(wrong,), **common)],
        ["toolfactory", "toolfactory_wrong"],
    )
    tokenizer, model = load_model("smollm2")
    config = verl_config(path, resolve_model_path("smollm2"))
    generator = HFGenerator(model, tokenizer, max_batch_size=8)
    worker = AgentLoopWorker(config, generator)
    batch = arithmetic_batch(2)

    async def run() -> Any:
        try:
            return await worker.generate_sequences(batch)
        finally:
            await generator.aclose()

    output = asyncio.run(run())
    return {"output": output, "model": model, "batch": batch}


def test_batch_has_verl_layout_and_in_loop_rewards(rollout: dict[str, Any]) -> None:
    out = rollout["output"]
    batch = out.batch
    assert batch["prompts"].shape == (4, PROMPT_LENGTH)
    assert batch["responses"].shape == (4, RESPONSE_LENGTH)
    assert batch["input_ids"].shape == (4, PROMPT_LENGTH + RESPONSE_LENGTH)
    assert "rm_scores" in set(batch.keys()), "reward_score from /v1/verify must reach veRL as rm_scores"
    assert "rollout_log_probs" in set(batch.keys())
    stats = out.non_tensor_batch["toolfactory"]
    assert all(s["tool_calls"] >= 1 for s in stats), stats
    assert all(s["stop_reason"] == "answer" for s in stats), stats
    # tool statistics reach veRL's reward_extra_info columns
    assert list(out.non_tensor_batch["tool_calls"]) == [s["tool_calls"] for s in stats]
    assert out.meta_info["reward_extra_keys"] == ["tool_calls", "tool_errors", "parse_errors", "verify_ok"]
    # veRL puts the score on the last valid response token
    scores = batch["rm_scores"].sum(-1)
    response_len = batch["attention_mask"][:, PROMPT_LENGTH:].sum(-1)
    last = batch["rm_scores"][range(4), response_len - 1]
    assert scores.tolist() == last.tolist()
    metrics = out.meta_info["metrics"]
    assert all(m["tool_calls"] > 0 and m["generate_sequences"] > 0 for m in metrics)


def test_changed_tool_result_changes_the_reward(rollout: dict[str, Any]) -> None:
    out = rollout["output"]
    rewards = out.batch["rm_scores"].sum(-1).tolist()
    agents = list(rollout["batch"].non_tensor_batch["agent_name"])
    good = [r for r, a in zip(rewards, agents, strict=True) if a == "toolfactory"]
    wrong = [r for r, a in zip(rewards, agents, strict=True) if a == "toolfactory_wrong"]
    assert good == [1.0, 1.0], rewards
    assert wrong == [0.0, 0.0], rewards
    answers = [s["final_answer"] for s in out.non_tensor_batch["toolfactory"]]
    assert int(answers[1]) == int(answers[0]) + 1 and int(answers[3]) == int(answers[2]) + 1


def test_observation_tokens_get_no_advantage_and_no_loss(rollout: dict[str, Any]) -> None:
    import torch
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, compute_policy_loss_vanilla
    from verl.utils.torch_functional import logprobs_from_logits
    from verl.workers.config import ActorConfig

    out, model = rollout["output"], rollout["model"]
    batch = out.batch
    mask = batch["response_mask"].float()
    valid = batch["attention_mask"][:, PROMPT_LENGTH:].float()
    observation = (valid == 1) & (mask == 0)
    assert observation.any(dim=1).all(), "every trajectory should contain spliced tool tokens"

    index = np.asarray(rollout["batch"].non_tensor_batch["index"])
    advantages, _ = compute_grpo_outcome_advantage(
        token_level_rewards=batch["rm_scores"], response_mask=batch["response_mask"], index=index
    )
    assert torch.all(advantages[mask == 0] == 0)
    assert torch.all(advantages[mask == 1].abs() > 0.5)  # reward differs inside every group

    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
            logits_to_keep=RESPONSE_LENGTH + 1,  # only the positions that predict response tokens
        ).logits
    log_prob = logprobs_from_logits(logits[:, :-1].float(), batch["responses"])
    rollout_log_prob = batch["rollout_log_probs"]
    gap = (log_prob - rollout_log_prob).abs()[mask == 1].max()
    assert gap < 2e-3, f"rollout log-probs differ from the recomputed ones by {gap}"

    log_prob = log_prob.clone().requires_grad_(True)
    actor = ActorConfig(strategy="fsdp", rollout_n=2, ppo_micro_batch_size_per_gpu=4, use_torch_compile=False)
    loss, metrics = compute_policy_loss_vanilla(
        old_log_prob=rollout_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=batch["response_mask"],
        loss_agg_mode="token-mean",
        config=actor,
    )
    loss.backward()
    grad = log_prob.grad
    assert torch.all(grad[mask == 0] == 0), "observation or padding tokens contributed to the loss"
    assert torch.all(grad[mask == 1] != 0)
    assert metrics["actor/ppo_kl"] == pytest.approx(0.0, abs=1e-3)


def test_entry_point_registers_the_loop(tmp_path: Path) -> None:
    """A ``verl.plugins`` entry point naming our module registers the loop on ``import verl``."""
    dist = tmp_path / "toolfactory_entry_point_test-0.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: toolfactory-entry-point-test\nVersion: 0.0.0\n"
    )
    (dist / "entry_points.txt").write_text("[verl.plugins]\ntoolfactory = trainer_client.verl.agent_loop\n")
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        import verl
        from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
        entry = _agent_loop_registry.get("toolfactory")
        print(entry)
        assert entry == {{"_target_": "trainer_client.verl.agent_loop.ToolFactoryAgentLoop"}}, entry
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
