#!/usr/bin/env bash
# The embedded default, end to end on CPU: set up, build the data from the shipped MNIST/FSDD subset,
# fit the MoVQGAN image tokenizer, train the tiny omni-modal model, evaluate held-out accuracy, and
# judge its drawings with a classifier trained apart (judge_drawn.py). Extra arguments are passed to
# `omnicore train` (e.g. --train.max_steps 50). Each stage's wall time is printed, and all of them at the end.
# Two processes instead of one: NPROC=2 bash examples/digits/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh
PY=.venv/bin/python
CFG=examples/digits/config.yaml
OUT=${OUT:-runs/digits}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
start=$(date +%s)
times=()
stage_done() { local now; now=$(date +%s); times+=("$1 $(( now - ${stage_start:-$start} )) s"); stage_start=$now; }

echo "== 1/6 data: JSONL + PNG from examples/digits/raw"
$PY examples/digits/build_data.py
stage_done data

echo "== 2/6 tokenizers: text (a byte-level BPE on the training text), image (a tiny MoVQGAN on MNIST indices 0-8999)"
# the MoVQGAN is fit again only when its inputs changed (command and MOVQ_STEPS, training images, fit code): see fit_tokenizer.sh
PY=$PY bash examples/digits/fit_tokenizer.sh
stage_done tokenizer

echo "== 3/6 train"
rm -rf "$OUT"
if [ "${NPROC:-1}" -gt 1 ]; then
  $PY -m torch.distributed.run --standalone --nproc-per-node "$NPROC" -m omnicore train $CFG --run.output_dir "$OUT" "$@"
else
  .venv/bin/omnicore train $CFG --run.output_dir "$OUT" "$@"
fi
stage_done train

echo "== 4/6 held-out accuracy (MNIST indices 9000-9999, FSDD takes 0-4)"
.venv/bin/omnicore eval $CFG --run.output_dir "$OUT" --export "$OUT/export"
stage_done eval

echo "== 5/6 generate: 'Draw the digit 7.'"
.venv/bin/omnicore generate $CFG --run.output_dir "$OUT" --export "$OUT/export" --prompt "Draw the digit 7." --out "$OUT/generated" --force
stage_done generate

echo "== 6/6 drawn digits: 10 samples per digit (temperature 0.5), judged by a classifier trained apart on MNIST 0-8999"
if [ ! -f examples/digits/data/judge/model.safetensors ]; then $PY examples/digits/judge_drawn.py fit; fi
$PY examples/digits/judge_drawn.py score --config $CFG --export "$OUT/export" --temperature "${JUDGE_TEMPERATURE:-0.5}"
stage_done judge

summary=$(printf '%s, ' "${times[@]}")
echo "finished in $(( $(date +%s) - start )) s (${summary%, }); checkpoints in $OUT/checkpoints, export in $OUT/export"
echo "pictures: $OUT/loss.png (loss, loss by part, learning rate, tokens/s), $OUT/samples/final.png (the digits 0-9 as drawn at the end)"
