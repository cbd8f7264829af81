#!/usr/bin/env bash
# Calculator + python GRPO on 8 GPUs: Qwen3-4B (thinking off), vLLM rollouts.
set -euo pipefail
MODEL=${MODEL:-Qwen/Qwen3-4B}
TASK_DATA=arithmetic
N_GPUS=8
PROMPT_LENGTH=1024
RESPONSE_LENGTH=3072
LOG_PROB_MICRO_BATCH=8
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

run_verl "${TOOLFACTORY_GRPO[@]}" \
    data.train_batch_size=256 \
    +data.apply_chat_template_kwargs.enable_thinking=False \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.agent.num_workers=8 \
    trainer.experiment_name=math_tools_grpo_qwen3-4b \
    trainer.save_freq=100 \
    trainer.test_freq=50 \
    trainer.total_training_steps=500 \
    trainer.total_epochs=10 \
    "$@"
