#!/usr/bin/env bash
# Image-environment tasks as veRL rows: $DATA_DIR/env/image-s0/{train,test}.parquet
# (prompt = the pack's policy as system text + the question about a 2000x1500 scene whose
# labels are too small to read whole; ground truth = the pack and task, looked up by the
# server; extra_info = level and the six tools' schemas). The scenes are drawn by the server
# from the same seed: keep --env-arg seed/tasks equal to server.yaml's arguments.
set -euo pipefail
DATA_DIR=${DATA_DIR:-$HOME/data/toolfactory}
python -m tools.data build --tasks env:tools.envs.image_env:pack \
    --env-arg seed=0 --env-arg tasks=4000 --env-test-fraction 0.05 --out "$DATA_DIR" "$@"
