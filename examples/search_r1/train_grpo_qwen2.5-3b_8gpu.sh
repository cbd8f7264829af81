#!/usr/bin/env bash
# Search-R1-style GRPO: Qwen2.5-3B (base) on 8 GPUs (one node), vLLM rollouts, the
# toolfactory agent loop against the tool server's search tool, reward = exact match
# computed by the server (/v1/verify) inside the loop.
# Hyperparameters follow the published Search-R1 GRPO runs (lr 1e-6, warm-up ratio 0.285,
# batch 512, 5 rollouts per prompt, KL loss 0.001 low_var_kl, ~1000 steps).
# Start the server first:  tool-server serve --config examples/search_r1/server.yaml
set -euo pipefail
MODEL=${MODEL:-Qwen/Qwen2.5-3B}
TASK_DATA=search_qa
N_GPUS=8
PROMPT_LENGTH=1024
RESPONSE_LENGTH=3072
LOG_PROB_MICRO_BATCH=16
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

run_verl "${TOOLFACTORY_GRPO[@]}" \
    data.train_batch_size=512 \
    data.filter_overlong_prompts=True \
    data.truncation=error \
    actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.285 \
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.rollout.n=5 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.agent.num_workers=8 \
    trainer.experiment_name=search_r1_grpo_qwen2.5-3b \
    trainer.save_freq=100 \
    trainer.test_freq=50 \
    trainer.total_training_steps=1005 \
    trainer.total_epochs=100 \
    "$@"
