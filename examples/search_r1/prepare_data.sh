#!/usr/bin/env bash
# Build the Search-R1-style QA data (FanOutQA sub-questions over the offline Wikipedia
# corpus) as veRL parquet: $DATA_DIR/search_qa/{train,test}.parquet.
set -euo pipefail
DATA_DIR=${DATA_DIR:-$HOME/data/toolfactory}
python -m tools.data build --tasks search_qa --out "$DATA_DIR" "$@"
