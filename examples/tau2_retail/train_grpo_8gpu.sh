#!/usr/bin/env bash
# τ²-bench retail GRPO on 8 GPUs: Qwen3-8B (thinking off), vLLM rollouts, long multi-turn
# trajectories against the tool server's retail world (examples/tau2_retail/server.yaml).
set -euo pipefail
MODEL=${MODEL:-Qwen/Qwen3-8B}
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

run_verl "${TOOLFACTORY_GRPO[@]}" \
    data.train_files="$DATA_DIR/env/tau2-retail/train.parquet" \
    data.val_files="$DATA_DIR/env/tau2-retail/test.parquet" \
    data.train_batch_size=32 \
    data.max_prompt_length=8192 \
    data.max_response_length=8192 \
    +data.apply_chat_template_kwargs.enable_thinking=False \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 \
    actor_rollout_ref.actor.ulysses_sequence_parallel_size=2 \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.prompt_length=8192 \
    actor_rollout_ref.rollout.response_length=8192 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2 \
    actor_rollout_ref.rollout.agent.num_workers=8 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2 \
    trainer.experiment_name=tau2_retail_grpo_qwen3-8b \
    trainer.n_gpus_per_node=8 \
    trainer.save_freq=20 \
    trainer.test_freq=10 \
    trainer.total_training_steps=200 \
    trainer.total_epochs=50 \
    "$@"
