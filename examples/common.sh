# Shared by every launch script in examples/*/train_grpo_*.sh (source it from the script).
# The script sets these first, then sources this file:
#   MODEL                 the policy model (a Hugging Face id or a local path)
#   TASK_DATA             the task data's folder under $DATA_DIR (train.parquet, test.parquet)
#   N_GPUS                GPUs on the one node
#   PROMPT_LENGTH         prompt token budget (the data filter and the rollout both use it)
#   RESPONSE_LENGTH       response token budget of a whole multi-turn trajectory
#   LOG_PROB_MICRO_BATCH  per-GPU micro-batch of the rollout and reference log-prob passes
# TOOLFACTORY_GRPO then holds the overrides every recipe shares: GRPO with a KL loss, vLLM
# async rollouts through the toolfactory agent loop configured by the recipe's own
# agent_loop.yaml. The script passes it, then what is its own, to run_verl, which runs
# veRL's PPO entry point with those overrides or, with DRY_RUN=1, prints them one per line
# (the tests compose them against veRL's own config schema to validate every key).
HERE=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)  # the directory of the sourcing script
export TOOLFACTORY_URL=${TOOLFACTORY_URL:-http://127.0.0.1:8000}
DATA_DIR=${DATA_DIR:-$HOME/data/toolfactory}

for _var in MODEL TASK_DATA N_GPUS PROMPT_LENGTH RESPONSE_LENGTH LOG_PROB_MICRO_BATCH; do
    if [[ -z "${!_var:-}" ]]; then
        echo "examples/common.sh: set $_var before sourcing it" >&2
        return 1
    fi
done
unset _var

TOOLFACTORY_GRPO=(
    # GRPO: group-relative advantages over the n rollouts of a prompt, no critic; the KL
    # to the reference policy is a loss term (low_var_kl), not a reward penalty
    algorithm.adv_estimator=grpo
    algorithm.use_kl_in_reward=False
    actor_rollout_ref.actor.use_kl_loss=True
    actor_rollout_ref.actor.kl_loss_coef=0.001
    actor_rollout_ref.actor.kl_loss_type=low_var_kl
    actor_rollout_ref.actor.optim.lr=1e-6
    # the task data; raw chat messages, which the agent loop renders itself
    data.train_files="$DATA_DIR/$TASK_DATA/train.parquet"
    data.val_files="$DATA_DIR/$TASK_DATA/test.parquet"
    data.return_raw_chat=True
    # token budgets: the data's prompt filter and the rollout get the same ones
    data.max_prompt_length="$PROMPT_LENGTH"
    data.max_response_length="$RESPONSE_LENGTH"
    actor_rollout_ref.rollout.prompt_length="$PROMPT_LENGTH"
    actor_rollout_ref.rollout.response_length="$RESPONSE_LENGTH"
    # the policy: padding-free batches and gradient checkpointing to fit long trajectories
    actor_rollout_ref.model.path="$MODEL"
    actor_rollout_ref.model.use_remove_padding=True
    actor_rollout_ref.model.enable_gradient_checkpointing=True
    # rollouts: vLLM in async mode, as veRL's agent loops need, returning the sampled
    # tokens' log-probs; LOG_PROB_MICRO_BATCH sizes the recomputed ones (here and ref below)
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.mode=async
    actor_rollout_ref.rollout.calculate_log_probs=True
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu="$LOG_PROB_MICRO_BATCH"
    # the toolfactory agent loop (tool calls and reward against the tool server), set up by
    # the agent_loop.yaml beside the script
    actor_rollout_ref.rollout.agent.agent_loop_config_path="$HERE/agent_loop.yaml"
    actor_rollout_ref.rollout.agent.default_agent_loop=toolfactory
    # the frozen reference policy, offloaded to CPU between its log-prob passes
    actor_rollout_ref.ref.fsdp_config.param_offload=True
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu="$LOG_PROB_MICRO_BATCH"
    # one node, console logging, one project name for all recipes
    trainer.nnodes=1
    trainer.n_gpus_per_node="$N_GPUS"
    trainer.logger='["console"]'
    trainer.project_name=toolfactory
)

run_verl() {
    if [[ "${DRY_RUN:-0}" == "1" ]]; then
        printf '%s\n' "$@"
        return 0
    fi
    python3 -m verl.trainer.main_ppo "$@"
}
