#!/usr/bin/env bash
# The embedded default, end to end on CPU: set up, build the data from the shipped MNIST/FSDD subset,
# fit the text tokenizer (and the shipped MoVQGAN image tokenizer again only if its inputs changed), train
# the tiny omni-modal model, evaluate held-out accuracy, and judge its drawings with a classifier trained
# apart (judge_drawn.py, shipped fitted). The run folder (runs/digits) is deleted first; OUT=DIR picks
# another. Extra arguments are passed to
# `omnicore train` (e.g. --train.max_steps 50). Each stage's wall time is printed, and all of them at the end.
# Two processes instead of one: NPROC=2 bash examples/digits/run.sh
# The five-task model of five.yaml (adds "Say the digit 7." -> speech and video -> "3 7 1"; data in
# examples/digits/data5, run in runs/digits5): TASKS=5 bash examples/digits/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh
PY=.venv/bin/python
case "${TASKS:-3}" in
  3) CFG=examples/digits/config.yaml; OUT=${OUT:-runs/digits} ;;
  5) CFG=examples/digits/five.yaml; OUT=${OUT:-runs/digits5} ;;
  *) echo "run.sh: TASKS must be 3 (config.yaml) or 5 (five.yaml), got '$TASKS'" >&2; exit 2 ;;
esac
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
N=6 codec=""
if [ "${TASKS:-3}" = 5 ]; then N=7 codec=", speech (the shipped mel RVQ: log-mel frames, 8 residual codebooks)"; fi  # the five-task run adds the spoken judge
start=$(date +%s)
times=()
stage_done() { local now; now=$(date +%s); times+=("$1 $(( now - ${stage_start:-$start} )) s"); stage_start=$now; }

echo "== 1/$N data: JSONL + PNG from examples/digits/raw"
$PY examples/digits/build_data.py
if [ "${TASKS:-3}" = 5 ]; then  # data/ (above) still holds the images the MoVQGAN is fit on, shared by both configs
  $PY examples/digits/build_data.py --out examples/digits/data5 --speak 1200 --eval-speak 100 --videos 2000 --eval-videos 200
fi
stage_done data

echo "== 2/$N tokenizers: text (a byte-level BPE on the training text), image (a tiny MoVQGAN on MNIST indices 0-8999, shipped)$codec"
# the MoVQGAN (examples/digits/movq) ships fitted and is fit again only when its inputs changed (command and MOVQ_STEPS,
# training images, fit code): see fit_tokenizer.sh; with TASKS=5 also the shipped speech tokenizer (a mel RVQ on FSDD
# takes 5-24, fit in about 20 s), by the same rule
CONFIG=$CFG PY=$PY bash examples/digits/fit_tokenizer.sh
stage_done tokenizer

echo "== 3/$N train"
rm -rf "$OUT"
if [ "${NPROC:-1}" -gt 1 ]; then
  $PY -m torch.distributed.run --standalone --nproc-per-node "$NPROC" -m omnicore train $CFG --run.output_dir "$OUT" "$@"
else
  .venv/bin/omnicore train $CFG --run.output_dir "$OUT" "$@"
fi
stage_done train

echo "== 4/$N held-out accuracy (MNIST indices 9000-9999, FSDD takes 0-4)"
.venv/bin/omnicore eval $CFG --run.output_dir "$OUT" --export "$OUT/export"
stage_done eval

PROMPTS=(--prompt "Draw the digit 7.") said=""
if [ "${TASKS:-3}" = 5 ]; then PROMPTS+=(--prompt "Say the digit 7.") said=" and 'Say the digit 7.' (a WAV)"; fi
echo "== 5/$N generate: 'Draw the digit 7.'$said"
.venv/bin/omnicore generate $CFG --run.output_dir "$OUT" --export "$OUT/export" "${PROMPTS[@]}" --out "$OUT/generated" --force
stage_done generate

echo "== 6/$N drawn digits: 10 samples per digit (temperature 0.5), judged by a classifier trained apart on MNIST 0-8999"
if [ ! -f examples/digits/judges/drawn/model.safetensors ]; then $PY examples/digits/judge_drawn.py fit; fi  # shipped fitted
$PY examples/digits/judge_drawn.py score --config $CFG --export "$OUT/export" --temperature "${JUDGE_TEMPERATURE:-0.5}"
stage_done judge
if [ "${TASKS:-3}" = 5 ]; then
  echo "== 7/$N spoken digits: 10 samples per digit (temperature ${SPEAK_TEMPERATURE:-0.5}), judged by a classifier trained apart on FSDD takes 5-24 and by the model's own ears"
  if [ ! -f examples/digits/judges/spoken/model.safetensors ]; then $PY examples/digits/judge_spoken.py fit; fi  # shipped fitted
  $PY examples/digits/judge_spoken.py score --config $CFG --export "$OUT/export" --temperature "${SPEAK_TEMPERATURE:-0.5}"
  stage_done judge_spoken
fi

summary=$(printf '%s, ' "${times[@]}")
echo "finished in $(( $(date +%s) - start )) s (${summary%, }); checkpoints in $OUT/checkpoints, export in $OUT/export"
echo "pictures: $OUT/loss.png (loss, loss by part, learning rate, tokens/s), $OUT/samples/final.png (the digits 0-9 as drawn at the end)"
