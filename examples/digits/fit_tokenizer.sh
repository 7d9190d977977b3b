#!/usr/bin/env bash
# The digits tokenizers of a config (CONFIG, default examples/digits/config.yaml), run from the
# repository root by run.sh and stages.sh; every folder it writes comes from the config (relative to it):
# - text: a byte-level BPE fitted on the training text (`omnicore fit-tokenizer`, a few seconds), written to
#   the foundation's `tokenizer:` folder (examples/digits/data/tokenizer) every time (deterministic: the
#   same data gives the same tokenizer);
# - image: a tiny MoVQGAN fit on the training digits (MNIST indices 0-8999, the PNGs that build_data.py
#   writes to examples/digits/data/images), shipped fitted in the `movqgan` decoder's checkpoint folder
#   (examples/digits/movq) and fit again whenever what it was fit from changed;
# - speech (a config with an `encodec` decoder, five.yaml): a tiny EnCodec fit on FSDD takes 5-24 (reported
#   on the held-out takes 0-4) into that decoder's checkpoint folder, kept the same way.
#   CONFIG=examples/digits/five.yaml bash examples/digits/fit_tokenizer.sh
# - speech as mel codes (a config with a `mel_rvq` decoder): a MelRVQ (log-mel frames coded by residual
#   k-means codebooks, Griffin-Lim back to audio) fit on FSDD takes 5-24 into that decoder's checkpoint
#   folder (shipped in examples/digits/mel), kept while its inputs hold; its fit takes seconds.
#
# DIR/fit.stamp records a fit's inputs: the command line (MOVQ_STEPS / CODEC_STEPS included), the
# training files (count and a hash of their bytes) and a hash of the fit code. A fitted tokenizer is
# kept only when it exists and its stamp equals the inputs now; otherwise it is fit again, and this
# says why. FORCE_MOVQ_FIT=1 (FORCE_CODEC_FIT=1, FORCE_MEL_FIT=1) refits in any case.
set -euo pipefail
PY=${PY:-.venv/bin/python}
CONFIG=${CONFIG:-examples/digits/config.yaml}
HERE=$(dirname "$CONFIG")

# the folder a config names, from the repository root: `tokenizer`, or the checkpoint of decoder NAME
tokenizer_dir() { sed -n 's/^ *tokenizer: *\([^ #]*\).*/\1/p' "$CONFIG" | head -1; }
checkpoint_of() { sed -n "/name: $1\$/,/checkpoint:/ s/^ *checkpoint: *\([^ #]*\).*/\1/p" "$CONFIG" | head -1; }
if [ ! -f "$CONFIG" ]; then echo "fit_tokenizer.sh: config $CONFIG not found (CONFIG is relative to the repository root)" >&2; exit 2; fi
TEXT=$(tokenizer_dir)
MOVQ=$(checkpoint_of movqgan)
CODEC=$(checkpoint_of encodec)
MEL=$(checkpoint_of mel_rvq)
# the speech representation of examples/digits/README.md ("The speech representation"): 12.5 frames/s, 8 codebooks of 256
DEFAULT_MEL_CONFIG='{"sample_rate": 8000, "n_mels": 40, "stack": 8, "num_codebooks": 8, "codebook_size": 256}'
if [ -z "$TEXT" ] || [ -z "$MOVQ" ]; then
  echo "fit_tokenizer.sh: $CONFIG must name the foundation's tokenizer: and a movqgan decoder's checkpoint: folder" >&2
  exit 2
fi
if grep -q 'name: encodec *$' "$CONFIG" && [ -z "$CODEC" ]; then
  echo "fit_tokenizer.sh: $CONFIG has an encodec decoder without a checkpoint: folder to fit into" >&2
  exit 2
fi
if grep -q 'name: mel_rvq *$' "$CONFIG" && [ -z "$MEL" ]; then
  echo "fit_tokenizer.sh: $CONFIG has a mel_rvq decoder without a checkpoint: folder to fit into" >&2
  exit 2
fi

# fit_unless_kept WHAT KIND DIR FORCE FILES CODE ON_CODE -- FIT COMMAND...: run the fit command (it writes DIR)
# unless DIR/fit.stamp equals its inputs now: the command, FILES (newline-separated paths, counted as
# KIND) and the CODE files; FORCE names the variable that refits in any case. ON_CODE is what a change
# of the fit code alone does: refit, or keep (a shipped fit that takes minutes: it says so and keeps it).
fit_unless_kept() {
  local what=$1 kind=$2 dir=$3 force=$4 files=$5 code=$6 on_code=$7 want changed
  shift 8
  if [ ! -e "$dir" ] && [ -d "$dir.previous" ]; then  # a fit that was interrupted: the folder it replaced comes back
    mv "$dir.previous" "$dir"
    echo "   put back $dir from $dir.previous (a fit of it was interrupted)"
  fi
  want=$(
    echo "command: python ${*:2}"
    echo "$kind: $(printf '%s\n' "$files" | grep -c . || true) files, sha256 $(printf '%s\n' "$files" | tr '\n' '\0' | xargs -0 cat | sha256sum | cut -c1-16)"
    # shellcheck disable=SC2086 # CODE is a list of paths without spaces
    echo "fit code: sha256 $(cat $code | sha256sum | cut -c1-16)"
  )
  if [ "${!force:-0}" != 1 ] && [ -f "$dir/config.json" ] && [ -f "$dir/fit.stamp" ]; then
    if [ "$(cat "$dir/fit.stamp")" = "$want" ]; then
      echo "   kept the fitted $what in $dir: same command, $kind and fit code as when it was fit ($dir/fit.stamp)"
      return 0
    fi
    if [ "$on_code" = keep ] && [ "$(head -n2 "$dir/fit.stamp")" = "$(echo "$want" | head -n2)" ]; then
      echo "   kept the shipped $what in $dir: same command and $kind as when it was fit, though the fit code changed since ($force=1 fits it again)"
      return 0
    fi
  fi
  if [ "${!force:-0}" = 1 ]; then
    echo "   fitting the $what again ($force=1)"
  elif [ -f "$dir/fit.stamp" ] && [ -f "$dir/config.json" ]; then
    changed=$({ diff "$dir/fit.stamp" <(echo "$want") || true; } | sed -n 's/^> \([a-z ]*\):.*/\1/p' | paste -sd, - | sed 's/,/, /g')
    echo "   fitting the $what again: its inputs changed ($changed; see $dir/fit.stamp)"
  elif [ -e "$dir" ]; then
    echo "   fitting the $what again: $dir holds no record of what it was fit from (or no config.json)"
  else
    echo "   fitting the $what (none yet)"
  fi
  # the folder being replaced (a shipped, git-tracked fit among them) stays aside until the new fit is done
  rm -rf "$dir.previous"
  if [ -e "$dir" ]; then mv "$dir" "$dir.previous"; fi
  if ! "$@"; then
    rm -rf "$dir"
    if [ -e "$dir.previous" ]; then mv "$dir.previous" "$dir"; fi
    echo "fit_tokenizer.sh: fitting the $what into $dir failed; $dir is as it was" >&2
    return 1
  fi
  echo "$want" > "$dir/fit.stamp"
  rm -rf "$dir.previous"
}

"$PY" -m omnicore fit-tokenizer "$CONFIG" --vocab-size "${TEXT_VOCAB:-400}" --out "$HERE/$TEXT" | sed 's/^/   /'

# the MoVQGAN ships fitted (examples/digits/movq: 100 steps, about 50 s on 2 cores), so a fresh clone
# keeps it while the command, the images build_data.py wrote and the fit code are those it was fit from
MOVQ=$HERE/$MOVQ
IMAGES=$HERE/data/images
fit_unless_kept tokenizer images "$MOVQ" FORCE_MOVQ_FIT \
  "$(find "$IMAGES" -maxdepth 1 -name '0[0-8]*.png' | LC_ALL=C sort)" \
  plugins/omnicore-image-movqgan/omnicore_image_movqgan/fit.py refit \
  -- "$PY" -m omnicore_image_movqgan.fit --images "$IMAGES/0[0-8]*.png" --out "$MOVQ" --steps "${MOVQ_STEPS:-100}"

if [ -n "$CODEC" ]; then
  # the codec ships fitted (examples/digits/codec: 3000 steps, about 8.5 minutes on 2 cores): it is fit
  # again only when the command or the recordings change, or with FORCE_CODEC_FIT=1
  CODEC=$HERE/$CODEC
  R=$HERE/raw/fsdd/recordings
  fit_unless_kept codec recordings "$CODEC" FORCE_CODEC_FIT \
    "$(find "$R" -maxdepth 1 \( -name '*_[5-9].wav' -o -name '*_1[0-9].wav' -o -name '*_2[0-4].wav' \) | LC_ALL=C sort)" \
    "$(printf 'plugins/omnicore-audio-codec/omnicore_audio_codec/%s.py ' fit losses processor)" keep \
    -- "$PY" -m omnicore_audio_codec.fit --audio "$R/*_[5-9].wav" "$R/*_1[0-9].wav" "$R/*_2[0-4].wav" \
    --held-out "$R/*_[0-4].wav" --out "$CODEC" --steps "${CODEC_STEPS:-3000}" --ae-steps "${CODEC_AE_STEPS:-1500}" \
    --config '{"sampling_rate": 8000, "upsampling_ratios": [5, 4, 4, 2]}'
fi

if [ -n "$MEL" ]; then
  # the MelRVQ ships fitted (examples/digits/mel: residual k-means, about 20 s on 2 cores) in the
  # representation README.md's grid chose (mel_grid.sh; MEL_CONFIG replaces it): fit again when the
  # command, the recordings or the fit code change, or with FORCE_MEL_FIT=1
  MEL_CONFIG=${MEL_CONFIG:-$DEFAULT_MEL_CONFIG}
  MEL=$HERE/$MEL
  R=$HERE/raw/fsdd/recordings
  fit_unless_kept "speech tokenizer" recordings "$MEL" FORCE_MEL_FIT \
    "$(find "$R" -maxdepth 1 \( -name '*_[5-9].wav' -o -name '*_1[0-9].wav' -o -name '*_2[0-4].wav' \) | LC_ALL=C sort)" \
    "$(printf 'plugins/omnicore-audio-mel/omnicore_audio_mel/%s.py ' fit tokenizer config)" refit \
    -- "$PY" -m omnicore_audio_mel.fit --audio "$R/*_[5-9].wav" "$R/*_1[0-9].wav" "$R/*_2[0-4].wav" \
    --held-out "$R/*_[0-4].wav" --out "$MEL" \
    --config "$MEL_CONFIG"
fi
