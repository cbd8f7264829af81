#!/usr/bin/env bash
# Arithmetic word problems that need a calculator (2-4 digit products, sums and
# differences of products): $DATA_DIR/arithmetic/{train,test}.parquet. Instruct models
# that know a tool-call format need no worked examples in the prompt (--few-shot 0).
set -euo pipefail
DATA_DIR=${DATA_DIR:-$HOME/data/toolfactory}
python -m tools.data build --tasks arithmetic --few-shot 0 --arith-train 20000 --arith-test 500 --out "$DATA_DIR" "$@"
