#!/usr/bin/env bash
# The GPU check (bench/engines/gpu_check.py): the HF backend and GRPO steps on CUDA, rollouts through a
# real tool server, tokens/s and step times printed, a JSON summary written; then veRL's own trainer
# on the CPU test's recipe (tests/engines/test_verl_trainer_cpu.py with TOOLFACTORY_VERL_DEVICE=cuda).
#
#   bench/engines/gpu_check.sh [--device cuda|cpu] [--tiny] [--out FILE] ...   (--help: all flags)
#
# On the GPU machine, whose image lacks our server's packages and veRL: run bench/engines/gpu_wheels.sh
# here first and carry .whl and .gpu_assets; this installs the wheels into $GPU_CHECK_SITE
# (/tmp/site) from $GPU_CHECK_WHEELS (.whl) when the interpreter cannot import them already. Our own code is used from this
# checkout (PYTHONPATH), not installed. PYTHON picks the interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
site=${GPU_CHECK_SITE:-/tmp/site}
wheels=${GPU_CHECK_WHEELS:-.whl}
export GPU_CHECK_SITE=$site

started=$(date +%s.%N)
needed='mcp starlette uvicorn orjson pydantic jsonschema re2 verl omegaconf tensordict codetiming'
if ! "$PYTHON" -c 'import importlib.util as u, sys; sys.exit(any(u.find_spec(n) is None for n in sys.argv[1:]))' $needed; then
  if ! ls "$wheels"/*.whl >/dev/null 2>&1; then
    echo "gpu_check.sh: $PYTHON cannot import the tool server's packages and veRL, and there are no" \
      "wheels in $wheels/: run bench/engines/gpu_wheels.sh where pip works and carry .whl (and .gpu_assets)" >&2
    exit 1
  fi
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$wheels"/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export GPU_CHECK_INSTALL_S=$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN {print b - a}')
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the tool server subprocess imports our code too
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
status=0
"$PYTHON" bench/engines/gpu_check.py "$@" || status=$?
# veRL's own trainer (main_ppo, FSDP worker, vLLM replica) on the same recipe as the CPU test
# (examples/verl_cpu/train_grpo_cpu.sh with DEVICE=cuda), checked by that test's assertions, when
# a CUDA device answers and this interpreter has vLLM and pytest; GPU_CHECK_VERL_TRAINER=0 skips it.
if [[ "${GPU_CHECK_VERL_TRAINER:-1}" != 0 ]] && "$PYTHON" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())'; then
  if "$PYTHON" -c 'import vllm, pytest' 2>/dev/null; then
    TOOLFACTORY_VERL_DEVICE=cuda "$PYTHON" -m pytest -q -s -p no:cacheprovider tests/engines/test_verl_trainer_cpu.py || status=1
  else
    echo "gpu_check.sh: veRL trainer check skipped: $PYTHON cannot import vllm and pytest" >&2
  fi
fi
exit $status
