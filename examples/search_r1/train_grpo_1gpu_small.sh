#!/usr/bin/env bash
# Search-R1-style GRPO on ONE GPU with a small model (Qwen2.5-0.5B-Instruct by default;
# a 24 GB card is enough): same agent loop and server, smaller batches, offloaded
# reference model. A quick way to check a tool set-up before the 8-GPU run.
set -euo pipefail
MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
TASK_DATA=search_qa
N_GPUS=1
PROMPT_LENGTH=1024
RESPONSE_LENGTH=2048
LOG_PROB_MICRO_BATCH=8
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

run_verl "${TOOLFACTORY_GRPO[@]}" \
    data.train_batch_size=32 \
    data.filter_overlong_prompts=True \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.n=5 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
    actor_rollout_ref.rollout.agent.num_workers=2 \
    trainer.experiment_name=search_r1_grpo_small_1gpu \
    trainer.save_freq=50 \
    trainer.test_freq=25 \
    trainer.total_training_steps=200 \
    trainer.total_epochs=20 \
    "$@"
