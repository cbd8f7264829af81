#!/usr/bin/env bash
# τ²-bench retail GRPO on 8 GPUs: Qwen3-8B (thinking off), vLLM rollouts, long multi-turn
# trajectories against the tool server's retail world (examples/tau2_retail/server.yaml).
set -euo pipefail
MODEL=${MODEL:-Qwen/Qwen3-8B}
TASK_DATA=env/tau2-retail
N_GPUS=8
PROMPT_LENGTH=8192
RESPONSE_LENGTH=8192
LOG_PROB_MICRO_BATCH=2
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

run_verl "${TOOLFACTORY_GRPO[@]}" \
    data.train_batch_size=32 \
    +data.apply_chat_template_kwargs.enable_thinking=False \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 \
    actor_rollout_ref.actor.ulysses_sequence_parallel_size=2 \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.agent.num_workers=8 \
    trainer.experiment_name=tau2_retail_grpo_qwen3-8b \
    trainer.save_freq=20 \
    trainer.test_freq=10 \
    trainer.total_training_steps=200 \
    trainer.total_epochs=50 \
    "$@"
