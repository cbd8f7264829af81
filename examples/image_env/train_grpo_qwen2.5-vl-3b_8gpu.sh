#!/usr/bin/env bash
# Image-environment GRPO on 8 GPUs: Qwen2.5-VL-3B-Instruct, vLLM rollouts; each view a tool
# returns (examples/image_env/server.yaml) reaches the model as image tokens.
# Response budget: 8192 tokens, about 6 turns of a view (at most 729 image tokens) and a reply;
# limit_images (vLLM's limit_mm_per_prompt) = max_turns x max_calls_per_turn of agent_loop.yaml.
set -euo pipefail
MODEL=${MODEL:-Qwen/Qwen2.5-VL-3B-Instruct}
TASK_DATA=env/image-s0
N_GPUS=8
PROMPT_LENGTH=2048
RESPONSE_LENGTH=8192
LOG_PROB_MICRO_BATCH=4
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

run_verl "${TOOLFACTORY_GRPO[@]}" \
    data.train_batch_size=64 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.enforce_eager=False \
    actor_rollout_ref.rollout.free_cache_engine=True \
    +actor_rollout_ref.rollout.limit_images=16 \
    actor_rollout_ref.rollout.agent.num_workers=8 \
    trainer.experiment_name=image_env_grpo_qwen2.5-vl-3b \
    trainer.save_freq=50 \
    trainer.test_freq=10 \
    trainer.total_training_steps=300 \
    trainer.total_epochs=10 \
    "$@"
