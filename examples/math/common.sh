# Shared by the launch scripts: run veRL's PPO entry point with the overrides in "$@",
# or, with DRY_RUN=1, print them one per line (the tests compose them against veRL's
# own config schema to validate every key).
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export TOOLFACTORY_URL=${TOOLFACTORY_URL:-http://127.0.0.1:8000}
DATA_DIR=${DATA_DIR:-$HOME/data/toolfactory}

run_verl() {
    if [[ "${DRY_RUN:-0}" == "1" ]]; then
        printf '%s\n' "$@"
        return 0
    fi
    python3 -m verl.trainer.main_ppo "$@"
}
