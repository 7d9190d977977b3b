#!/usr/bin/env bash
# The digits tokenizers, run from the repository root by run.sh and stages.sh:
# - text: a byte-level BPE fitted on the training text (`omnicore fit-tokenizer`, a few seconds), written to
#   examples/digits/data/tokenizer every time (deterministic: the same data gives the same tokenizer);
# - image: a tiny MoVQGAN fit on the training digits (MNIST indices 0-8999), fit again whenever what
#   it was fit from changed (below).
#
# examples/digits/data/movq/fit.stamp records the fit's inputs: the command line (MOVQ_STEPS
# included), the training images (count and a hash of their bytes) and a hash of the fit code. The
# tokenizer is kept only when it exists and its stamp equals the inputs now; otherwise it is fit
# again, and this says why. FORCE_MOVQ_FIT=1 refits in any case.
set -euo pipefail
PY=${PY:-.venv/bin/python}
MOVQ=examples/digits/data/movq
IMAGES=examples/digits/data/images
FIT_CODE=plugins/omnicore-image-movqgan/omnicore_image_movqgan/fit.py
FIT=("$PY" -m omnicore_image_movqgan.fit --images "$IMAGES/0[0-8]*.png" --out "$MOVQ" --steps "${MOVQ_STEPS:-150}")

inputs() {
  local files
  files=$(find "$IMAGES" -maxdepth 1 -name '0[0-8]*.png' | LC_ALL=C sort)
  echo "command: python ${FIT[*]:1}"
  echo "images: $(printf '%s\n' "$files" | grep -c . || true) files, sha256 $(printf '%s\n' "$files" | tr '\n' '\0' | xargs -0 cat | sha256sum | cut -c1-16)"
  echo "fit code: sha256 $(sha256sum "$FIT_CODE" | cut -c1-16)"
}

"$PY" -m omnicore fit-tokenizer examples/digits/config.yaml --vocab-size "${TEXT_VOCAB:-400}" --out examples/digits/data/tokenizer \
  | sed 's/^/   /'

want=$(inputs)
if [ "${FORCE_MOVQ_FIT:-0}" != 1 ] && [ -f "$MOVQ/config.json" ] && [ -f "$MOVQ/fit.stamp" ] && [ "$(cat "$MOVQ/fit.stamp")" = "$want" ]; then
  echo "   kept the fitted tokenizer in $MOVQ: same command, images and fit code as when it was fit ($MOVQ/fit.stamp)"
  exit 0
fi
if [ "${FORCE_MOVQ_FIT:-0}" = 1 ]; then
  echo "   fitting the tokenizer again (FORCE_MOVQ_FIT=1)"
elif [ -f "$MOVQ/fit.stamp" ] && [ -f "$MOVQ/config.json" ]; then
  changed=$({ diff "$MOVQ/fit.stamp" <(echo "$want") || true; } | sed -n 's/^> \([a-z ]*\):.*/\1/p' | paste -sd, - | sed 's/,/, /g')
  echo "   fitting the tokenizer again: its inputs changed ($changed; see $MOVQ/fit.stamp)"
elif [ -e "$MOVQ" ]; then
  echo "   fitting the tokenizer again: $MOVQ holds no record of what it was fit from (or no config.json)"
else
  echo "   fitting the tokenizer (none yet)"
fi
rm -rf "$MOVQ"
"${FIT[@]}"
echo "$want" > "$MOVQ/fit.stamp"
