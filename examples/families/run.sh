#!/usr/bin/env bash
# Fine-tune a published-layout multimodal checkpoint, evaluate it, and serve the export with
# transformers. The checkpoint's model type picks the family (model.foundation.name: auto).
#   bash examples/families/run.sh                          # a tiny Qwen2-VL stand-in on CPU (runs/qwen2_vl)
#   FAMILY=llava_next bash examples/families/run.sh        # any image model type with a stand-in (runs/llava_next)
#   .venv/bin/python examples/families/prepare.py --list   # the model types, and the family auto picks for each
#   CHECKPOINT=Qwen/Qwen2-VL-2B-Instruct bash examples/families/run.sh   # a published one (a GPU machine; README.md)
# Extra arguments are config overrides for `omnicore train` and `omnicore eval`. OUT= sets the run
# folder (default runs/$FAMILY, or runs/<last part of CHECKPOINT>), which this script deletes
# before training.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh
PY=.venv/bin/python
HERE=examples/families
CFG=$HERE/config.yaml
FAMILY=${FAMILY:-qwen2_vl}
CHECKPOINT=${CHECKPOINT:-}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

if [ -n "$CHECKPOINT" ]; then
  echo "== 1/4 data ($CHECKPOINT is the checkpoint)"
  $PY $HERE/prepare.py --data-only
  OUT=${OUT:-runs/${CHECKPOINT##*/}}
else
  echo "== 1/4 data and the stand-in checkpoint ($FAMILY in $HERE/standins/$FAMILY)"
  $PY $HERE/prepare.py --family "$FAMILY" --checkpoint "$HERE/standins/$FAMILY"
  CHECKPOINT=standins/$FAMILY  # relative to the config's folder, as in config.yaml
  OUT=${OUT:-runs/$FAMILY}
fi
MODEL=(--model.foundation.name auto --model.foundation.options.checkpoint "$CHECKPOINT")

echo "== 2/4 train"
rm -rf "$OUT"
.venv/bin/omnicore train $CFG --run.output_dir "$OUT" "${MODEL[@]}" "$@"

echo "== 3/4 held-out accuracy, read back from the export (the published layout)"
.venv/bin/omnicore eval $CFG --run.output_dir "$OUT" "${MODEL[@]}" "$@" --export "$OUT/export"

echo "== 4/4 serve the export with transformers"
$PY $HERE/serve.py "$OUT/export" --data $HERE/data/eval.jsonl --limit 8 --max-new-tokens 8 --json "$OUT/served.json"
