#!/usr/bin/env bash
# Fine-tune a published-layout Qwen2-VL folder, evaluate it, and serve the export with transformers.
#   bash examples/qwen2_vl/run.sh                      # the tiny stand-in on CPU (a few minutes)
#   FAMILY=qwen2_5_vl bash examples/qwen2_vl/run.sh    # a Qwen2.5-VL stand-in instead (runs/qwen2_5_vl)
#   FAMILY=qwen3_vl bash examples/qwen2_vl/run.sh      # a Qwen3-VL stand-in, foundation qwen3_vl (runs/qwen3_vl)
#   bash examples/qwen2_vl/run.sh --model.foundation.options.checkpoint Qwen/Qwen2-VL-2B-Instruct   # a GPU machine
# Extra arguments are config overrides for `omnicore train` and `omnicore eval`. OUT= sets the run
# folder (default runs/$FAMILY), which this script deletes before training.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh
PY=.venv/bin/python
CFG=examples/qwen2_vl/config.yaml
FAMILY=${FAMILY:-qwen2_vl}
case "$FAMILY" in
  qwen2_vl) STANDIN=standin; FOUNDATION=qwen2_vl ;;
  qwen2_5_vl) STANDIN=standin_qwen2_5_vl; FOUNDATION=qwen2_vl ;;
  qwen3_vl) STANDIN=standin_qwen3_vl; FOUNDATION=qwen3_vl ;;
  *) echo "run.sh: FAMILY must be qwen2_vl, qwen2_5_vl or qwen3_vl, not $FAMILY" >&2; exit 2 ;;
esac
OUT=${OUT:-runs/$FAMILY}
# the stand-in of each family has its own folder (relative to the config's folder, as in config.yaml)
MODEL=(--model.foundation.name "$FOUNDATION" --model.foundation.options.checkpoint "$STANDIN")
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

echo "== 1/4 data and the stand-in checkpoint ($FAMILY in examples/qwen2_vl/$STANDIN)"
$PY examples/qwen2_vl/prepare.py --family "$FAMILY" --checkpoint "examples/qwen2_vl/$STANDIN"

echo "== 2/4 train"
rm -rf "$OUT"
.venv/bin/omnicore train $CFG --run.output_dir "$OUT" "${MODEL[@]}" "$@"

echo "== 3/4 held-out accuracy, read back from the export (the published layout)"
.venv/bin/omnicore eval $CFG --run.output_dir "$OUT" "${MODEL[@]}" "$@" --export "$OUT/export"

echo "== 4/4 serve the export with transformers alone"
$PY examples/qwen2_vl/serve.py "$OUT/export" --data examples/qwen2_vl/data/eval.jsonl --limit 8 --max-new-tokens 8 --json "$OUT/served.json"
