#!/usr/bin/env bash
# Search-R1-style GRPO: Qwen3-4B on 8 GPUs, as RLFactory's published Qwen3-4B runs
# (NQ exact match 0.458-0.486 there). Same loop and server as the Qwen2.5-3B script;
# Qwen3's thinking is turned off in the chat template (the answers are short facts).
set -euo pipefail
MODEL=${MODEL:-Qwen/Qwen3-4B}
TASK_DATA=search_qa
N_GPUS=8
PROMPT_LENGTH=1024
RESPONSE_LENGTH=4096
LOG_PROB_MICRO_BATCH=8
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

run_verl "${TOOLFACTORY_GRPO[@]}" \
    data.train_batch_size=256 \
    data.filter_overlong_prompts=True \
    +data.apply_chat_template_kwargs.enable_thinking=False \
    actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1 \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.agent.num_workers=8 \
    trainer.experiment_name=search_r1_grpo_qwen3-4b \
    trainer.save_freq=100 \
    trainer.test_freq=50 \
    trainer.total_training_steps=1000 \
    trainer.total_epochs=100 \
    "$@"
