#!/usr/bin/env bash
# The embedded default, end to end on CPU: set up, build the data from the shipped MNIST/FSDD subset,
# fit the MoVQGAN image tokenizer, train the tiny omni-modal model, evaluate held-out accuracy, and
# generate an image. Extra arguments are passed to `omnicore train` (e.g. --train.max_steps 50).
# Two processes instead of one: NPROC=2 bash examples/digits/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh
PY=.venv/bin/python
CFG=examples/digits/config.yaml
OUT=${OUT:-runs/digits}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
start=$(date +%s)

echo "== 1/5 data: JSONL + PNG from examples/digits/raw"
$PY examples/digits/build_data.py

echo "== 2/5 image tokenizer: fit a tiny MoVQGAN on the training digits (MNIST indices 0-8999)"
# (re)fit when there is no tokenizer yet, or one in the format before omnicore_extra.safetensors
if [ ! -f examples/digits/data/movq/config.json ] || [ -f examples/digits/data/movq/omnicore_decoder.json ]; then
  rm -rf examples/digits/data/movq
  $PY -m omnicore_image_movqgan.fit --images 'examples/digits/data/images/0[0-8]*.png' \
      --out examples/digits/data/movq --steps "${MOVQ_STEPS:-150}"
fi

echo "== 3/5 train"
rm -rf "$OUT"
if [ "${NPROC:-1}" -gt 1 ]; then
  $PY -m torch.distributed.run --standalone --nproc-per-node "$NPROC" -m omnicore train $CFG --run.output_dir "$OUT" "$@"
else
  .venv/bin/omnicore train $CFG --run.output_dir "$OUT" "$@"
fi

echo "== 4/5 held-out accuracy (MNIST indices 9000-9999, FSDD takes 0-4)"
.venv/bin/omnicore eval $CFG --run.output_dir "$OUT" --export "$OUT/export"

echo "== 5/5 generate: 'Draw the digit 7.'"
.venv/bin/omnicore generate $CFG --run.output_dir "$OUT" --export "$OUT/export" --prompt "Draw the digit 7." --out "$OUT/generated"

echo "finished in $(( $(date +%s) - start )) s; checkpoints in $OUT/checkpoints, export in $OUT/export"
