# Shared by the launch scripts in math/ and search_r1/ (source it from the script):
# run_verl runs veRL's PPO entry point with the overrides given, or, with DRY_RUN=1,
# prints them one per line (the tests compose them against veRL's own config schema
# to validate every key). TOOLFACTORY_GRPO holds the overrides every recipe shares:
# GRPO with a KL loss, vLLM async rollouts through the toolfactory agent loop
# configured by the recipe's own agent_loop.yaml.
HERE=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)  # the directory of the sourcing script
export TOOLFACTORY_URL=${TOOLFACTORY_URL:-http://127.0.0.1:8000}
DATA_DIR=${DATA_DIR:-$HOME/data/toolfactory}

TOOLFACTORY_GRPO=(
    algorithm.adv_estimator=grpo
    algorithm.use_kl_in_reward=False
    data.return_raw_chat=True
    actor_rollout_ref.model.path="$MODEL"
    actor_rollout_ref.model.use_remove_padding=True
    actor_rollout_ref.model.enable_gradient_checkpointing=True
    actor_rollout_ref.actor.use_kl_loss=True
    actor_rollout_ref.actor.kl_loss_coef=0.001
    actor_rollout_ref.actor.kl_loss_type=low_var_kl
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.mode=async
    actor_rollout_ref.rollout.calculate_log_probs=True
    actor_rollout_ref.rollout.agent.agent_loop_config_path="$HERE/agent_loop.yaml"
    actor_rollout_ref.rollout.agent.default_agent_loop=toolfactory
    actor_rollout_ref.ref.fsdp_config.param_offload=True
    trainer.logger='["console"]'
    trainer.project_name=toolfactory
    trainer.nnodes=1
)

run_verl() {
    if [[ "${DRY_RUN:-0}" == "1" ]]; then
        printf '%s\n' "$@"
        return 0
    fi
    python3 -m verl.trainer.main_ppo "$@"
}
