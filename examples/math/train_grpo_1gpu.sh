#!/usr/bin/env bash
# Calculator + python GRPO on one GPU: Qwen2.5-1.5B-Instruct, vLLM rollouts, the
# toolfactory agent loop against examples/math/server.yaml.
set -euo pipefail
MODEL=${MODEL:-Qwen/Qwen2.5-1.5B-Instruct}
TASK_DATA=arithmetic
N_GPUS=1
PROMPT_LENGTH=1024
RESPONSE_LENGTH=2048
LOG_PROB_MICRO_BATCH=8
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

run_verl "${TOOLFACTORY_GRPO[@]}" \
    data.train_batch_size=64 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.5 \
    actor_rollout_ref.rollout.agent.num_workers=2 \
    trainer.experiment_name=math_tools_grpo_1gpu \
    trainer.save_freq=50 \
    trainer.test_freq=25 \
    trainer.total_training_steps=300 \
    trainer.total_epochs=10 \
    "$@"
