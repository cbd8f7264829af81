#!/usr/bin/env bash
# GRPO through veRL's own trainer (python -m verl.trainer.main_ppo, RayPPOTrainer) on the CPU:
# veRL's FSDP worker on gloo, veRL's vLLM replica on vLLM's CPU build, our agent loop, the tool
# server on loopback. Two steps of SmolLM2-135M-Instruct by default; a check that the whole
# integration runs before it goes to GPUs (same recipe: examples/common.sh), not a way to
# train a useful model. See docs/engines.md ("veRL's trainer on the CPU").
#
# Needs: make setup, make vllm (.venv-vllm), a tool server at $TOOLFACTORY_URL
# (tool-server serve), and the search QA data with worked examples in the prompts (without
# them SmolLM2-135M never searches): python -m tools.data build --tasks search_qa
# --search-few-shot 2 --out "$DATA_DIR".
# Run it with the project's python first on PATH (source .venv/bin/activate).
set -euo pipefail
# the packaged SmolLM2-135M-Instruct (written to the cache on first use), else the Hub's
MODEL=${MODEL:-$(python -c "from trainer_client.backends.models import resolve_model_path as r; print(r('smollm2'))" 2>/dev/null || echo HuggingFaceTB/SmolLM2-135M-Instruct)}
TASK_DATA=${TASK_DATA:-search_qa}
N_GPUS=1
PROMPT_LENGTH=${PROMPT_LENGTH:-512}
RESPONSE_LENGTH=${RESPONSE_LENGTH:-256}
LOG_PROB_MICRO_BATCH=2  # divides rollout.n (veRL asserts it)
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

# veRL's "cpu" platform (trainer_client/verl/cpu_platform.py, loaded by the verl.plugins entry
# point in every veRL process) and vLLM's CPU build importable beside veRL (the overlay appends
# .venv-vllm's packages after the project's: their transformers pins do not overlap).
# DEVICE=cuda runs the same recipe on veRL's CUDA platform with vLLM from this environment
# (bench/engines/gpu_check.sh does, when a GPU answers).
DEVICE=${DEVICE:-cpu}
# On a CPU without native bf16 (AVX512-BF16/AMX) veRL's FSDP computes in float32 (its default is
# bf16, which such a CPU emulates: one 768x576x1536 matmul took 31 ms in fp32, 1,757 ms in bf16 on
# an AVX2 machine); trainer_client.backends.vllm_server.cpu_dtype decides. The replica stays bf16:
# vLLM 0.32's CPU float32 linear layers lose `weight_loader` after loading, so veRL's weight push
# fails there ('Parameter' object has no attribute 'weight_loader', linear.py:1341).
CPU_SETTINGS=()
if [[ "$DEVICE" == cpu ]]; then
    CPU_DTYPE=$(python -c "from trainer_client.backends.vllm_server import cpu_dtype; print(cpu_dtype())" 2>/dev/null || echo bfloat16)
    CPU_SETTINGS=(
        +actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype="$CPU_DTYPE"
        +actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype="$CPU_DTYPE"
    )
fi
if [[ "$DEVICE" == cpu && "${DRY_RUN:-0}" != 1 ]]; then
    export VERL_PLATFORM=cpu
    OVERLAY=${OVERLAY:-$(python -m trainer_client.verl.vllm_overlay "${TMPDIR:-/tmp}/toolfactory-vllm-overlay")}
    export PYTHONPATH="$OVERLAY${PYTHONPATH:+:$PYTHONPATH}"
fi
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} TOKENIZERS_PARALLELISM=false
CPUS=${CPUS:-2}

# rollout.n=6: at temperature 1.0 SmolLM2-135M follows the worked examples' <search> about one
# time in four (at 0.7 always, but then its rollouts all earn the same reward); six per step make
# a spliced observation and a reward spread likely in two steps.
# Micro-batches of 2: in float32 six 768-token sequences at once peaked at 13 GB in the actor
# (kernel OOM kill beside a test suite). reward.num_workers=1: the reward comes from the tool server inside the agent loop; veRL's
# default 8 reward-loop workers (~0.7 GB each, 5.4 GB in all) would only pass it on.
run_verl "${TOOLFACTORY_GRPO[@]}" "${CPU_SETTINGS[@]}" \
    trainer.use_v1=False \
    trainer.device="$DEVICE" \
    actor_rollout_ref.actor.strategy=fsdp2 \
    actor_rollout_ref.actor.fsdp_config.strategy=fsdp2 \
    actor_rollout_ref.ref.fsdp_config.strategy=fsdp2 \
    actor_rollout_ref.actor.fsdp_config.use_torch_compile=False \
    actor_rollout_ref.ref.fsdp_config.use_torch_compile=False \
    ray_kwargs.ray_init.num_cpus="$CPUS" \
    +ray_kwargs.ray_init.include_dashboard=False \
    reward.num_workers=1 \
    data.train_batch_size=1 \
    data.dataloader_num_workers=0 \
    actor_rollout_ref.rollout.n=6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=1 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
    actor_rollout_ref.actor.optim.lr=5e-5 \
    actor_rollout_ref.actor.use_torch_compile=False \
    actor_rollout_ref.ref.use_torch_compile=False \
    actor_rollout_ref.ref.fsdp_config.param_offload=False \
    actor_rollout_ref.model.use_remove_padding=False \
    actor_rollout_ref.model.enable_gradient_checkpointing=False \
    +actor_rollout_ref.model.override_config.attn_implementation=sdpa \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.enforce_eager=True \
    actor_rollout_ref.rollout.free_cache_engine=False \
    +actor_rollout_ref.rollout.enable_sleep_mode=False \
    actor_rollout_ref.rollout.max_model_len=$((PROMPT_LENGTH + RESPONSE_LENGTH)) \
    actor_rollout_ref.rollout.max_num_seqs=16 \
    actor_rollout_ref.rollout.max_num_batched_tokens=2048 \
    actor_rollout_ref.rollout.agent.num_workers=1 \
    trainer.val_before_train=False \
    trainer.test_freq=-1 \
    trainer.save_freq=-1 \
    trainer.total_training_steps=${STEPS:-2} \
    trainer.total_epochs=1 \
    trainer.experiment_name=grpo_cpu \
    "$@"
