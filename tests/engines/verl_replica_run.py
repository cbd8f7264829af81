"""The child process of ``test_verl_replica.py``: veRL 0.9.1's own rollout path on a real vLLM replica.

``python verl_replica_run.py SPEC.json OUT.pt``: veRL's ``LLMServerManager`` launches one
standalone vLLM replica (Ray told of one fake GPU, as veRL asks for one), veRL's
``AgentLoopManager`` runs our AgentLoop plug-in (from the agent-loop YAML) in its Ray worker
over the replica's server handle, and the output ``DataProto``'s tensors and statistics are
saved with ``torch.save``. It runs in the project's ``.venv`` with vLLM importable from
``.venv-vllm`` (the parent test puts a ``sitecustomize`` on ``PYTHONPATH`` that appends
vLLM's site-packages after everything else, and a ``vllm`` dist-info veRL's version check reads).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def column(values: list[Any]) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):  # one by one: equal-length lists would broadcast
        array[i] = value
    return array


def verl_config(spec: dict[str, Any]) -> Any:
    """veRL's ppo_trainer config with the overrides a CPU replica needs (see docs/engines.md)."""
    import verl
    from hydra import compose, initialize_config_dir

    rollout = "actor_rollout_ref.rollout"
    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(
            "ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={spec['model_path']}",
                f"{rollout}.name=vllm",
                f"{rollout}.prompt_length={spec['prompt_length']}",
                f"{rollout}.response_length={spec['response_length']}",
                f"{rollout}.temperature=0",
                f"{rollout}.calculate_log_probs=True",
                f"{rollout}.agent.agent_loop_config_path={spec['agent_loop_yaml']}",
                f"{rollout}.agent.default_agent_loop={spec['default_loop']}",
                f"{rollout}.agent.num_workers=1",
                # CPU: real weights (veRL's default is dummy weights, synced from the actor
                # later), no sleep mode or cache freeing (CUDA memory pools), no CUDA graphs.
                f"{rollout}.load_format=auto",
                f"{rollout}.free_cache_engine=False",
                f"+{rollout}.enable_sleep_mode=False",
                f"{rollout}.enforce_eager=True",
                f"{rollout}.tensor_model_parallel_size=1",
                f"{rollout}.nnodes=1",
                f"{rollout}.n_gpus_per_node=1",
                "trainer.n_gpus_per_node=1",
                f"{rollout}.max_model_len=2048",
                f"{rollout}.max_num_seqs=16",
                f"{rollout}.max_num_batched_tokens=2048",
            ],
        )


def main(spec_path: str, out_path: str) -> int:
    import ray
    import torch
    from verl import DataProto

    spec = json.loads(Path(spec_path).read_text())
    rows = spec["rows"]
    config = verl_config(spec)
    ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, log_to_driver=True)
    try:
        from verl.experimental.agent_loop.agent_loop import AgentLoopManager
        from verl.workers.rollout.llm_server import LLMServerManager

        started = time.perf_counter()
        servers = LLMServerManager.create(config=config)
        ready_s = time.perf_counter() - started
        loops = AgentLoopManager.create(config=config, llm_client=servers.get_client())
        batch = DataProto.from_dict(
            non_tensors={key: column([row[key] for row in rows]) for key in rows[0]},
        )
        started = time.perf_counter()
        output = loops.generate_sequences(batch)
        rollout_s = time.perf_counter() - started
        extras = output.non_tensor_batch
        torch.save(
            {
                "batch": {key: value.clone() for key, value in output.batch.items()},
                "stats": list(extras.get("toolfactory", [])),  # the plug-in's per-trajectory statistics
                "non_tensor_keys": sorted(extras),
                "multi_modal_inputs": [dict(m or {}) for m in extras.get("multi_modal_inputs", [])],
                "ready_s": ready_s,
                "rollout_s": rollout_s,
                "addresses": servers.get_addresses(),
            },
            out_path,
        )
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
