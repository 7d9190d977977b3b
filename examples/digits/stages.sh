#!/usr/bin/env bash
# The two-stage recipe on the digits data (LLaVA-style), on CPU:
#   stage 1: only the projectors learn (encoders.*.projector, the image decoder's code_embed and
#            lm_head); the language model `lm`, the SigLIP and Whisper towers and the MoVQ
#            tokenizer `vq` are frozen (train.freeze);
#   stage 2: starts from stage 1's export (model.init_from: weights only, a new optimizer, LR
#            schedule and data position) and trains everything but the tokenizer; STAGE2=lora trains
#            LoRA adapters on the language model instead of its weights (model.lora).
# Held-out accuracy is printed after each stage. Both stages use examples/digits/config.yaml with
# command-line overrides. Extra arguments go to both `omnicore train` calls; a short version:
#   STAGE1_STEPS=20 STAGE2_STEPS=20 EVAL_LIMIT=40 bash examples/digits/stages.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh
PY=.venv/bin/python
CFG=examples/digits/config.yaml
OUT=${OUT:-runs/digits-stages}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
LIMIT=()
if [ -n "${EVAL_LIMIT:-}" ]; then LIMIT=(--limit "$EVAL_LIMIT"); fi
start=$(date +%s)

echo "== data and image tokenizer (as in run.sh)"
$PY examples/digits/build_data.py
PY=$PY bash examples/digits/fit_tokenizer.sh  # fit again when its inputs changed
rm -rf "$OUT"

echo "== stage 1: projectors only"
.venv/bin/omnicore train $CFG --run.output_dir "$OUT/stage1" --train.max_steps "${STAGE1_STEPS:-1000}" \
    --train.freeze "[lm, encoders.image.tower, encoders.audio.whisper, decoders.image.vq]" "$@"
echo "-- stage 1 held-out accuracy"
.venv/bin/omnicore eval $CFG --run.output_dir "$OUT/stage1" --export "$OUT/stage1/export" "${LIMIT[@]}"

echo "== stage 2: from stage 1's export, ${STAGE2:-full} training"
STAGE2_ARGS=(--train.freeze "[decoders.image.vq]")
if [ "${STAGE2:-full}" = lora ]; then
  # adapters on the LM's attention projections (PEFT): inside `lm` only they train, outside it all but the tokenizer
  STAGE2_ARGS=(--train.freeze "[decoders.image.vq]" --model.lora "{r: 16, alpha: 32, modules: [lm]}")
fi
# init_from is relative to the config file; an absolute path names the folder under the current one
.venv/bin/omnicore train $CFG --run.output_dir "$OUT/stage2" --train.max_steps "${STAGE2_STEPS:-2000}" \
    --model.init_from "$PWD/$OUT/stage1/export" "${STAGE2_ARGS[@]}" "$@"
echo "-- stage 2 held-out accuracy"
.venv/bin/omnicore eval $CFG --run.output_dir "$OUT/stage2" --export "$OUT/stage2/export" "${LIMIT[@]}"

echo "finished in $(( $(date +%s) - start )) s; stage exports in $OUT/stage1/export and $OUT/stage2/export"
