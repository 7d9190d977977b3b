#!/usr/bin/env bash
# Fine-tune a published-layout Qwen2-VL folder, evaluate it, and serve the export with transformers.
#   bash examples/qwen2_vl/run.sh                      # the tiny stand-in on CPU (a few minutes)
#   FAMILY=qwen2_5_vl bash examples/qwen2_vl/run.sh    # a Qwen2.5-VL stand-in instead
#   bash examples/qwen2_vl/run.sh --model.foundation.options.checkpoint Qwen/Qwen2-VL-2B-Instruct   # a GPU machine
# Extra arguments are config overrides for `omnicore train`.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh
PY=.venv/bin/python
CFG=examples/qwen2_vl/config.yaml
OUT=${OUT:-runs/qwen2_vl}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

echo "== 1/4 data and the stand-in checkpoint"
$PY examples/qwen2_vl/prepare.py --family "${FAMILY:-qwen2_vl}"

echo "== 2/4 train"
rm -rf "$OUT"
.venv/bin/omnicore train $CFG --run.output_dir "$OUT" "$@"

echo "== 3/4 held-out accuracy, read back from the export (the published layout)"
.venv/bin/omnicore eval $CFG --run.output_dir "$OUT" --export "$OUT/export"

echo "== 4/4 serve the export with transformers alone"
$PY examples/qwen2_vl/serve.py "$OUT/export" --data examples/qwen2_vl/data/eval.jsonl --limit 8 --max-new-tokens 8 --json "$OUT/served.json"
