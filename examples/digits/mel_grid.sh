#!/usr/bin/env bash
# The speech-representation grid of README.md ("The speech representation"): for each stack, number
# of codebooks K and mel bands, fit a MelRVQ on FSDD takes 5-24 (python -m omnicore_audio_mel.fit)
# and judge the held-out takes 0-4 through it (judge_spoken.py ceiling); per mel setting, also the
# log-mel through Griffin-Lim without codes (UNQUANTISED=0 leaves it out). Prints a Markdown table of
# every fit in OUT (earlier runs' too); each fit and its ceiling.json stay in OUT/s{stack}-k{K}-m{mels}.
# Run from the repository root; the default grid takes about 10 minutes on 2 cores.
#   STACKS="2 4" KS="2 4 8" MELS="40 80" OUT=runs/mel_grid bash examples/digits/mel_grid.sh
set -euo pipefail
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/mel_grid}
STACKS=${STACKS:-2 4}
KS=${KS:-2 4 8}
MELS=${MELS:-40 80}
R=examples/digits/raw/fsdd/recordings
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$OUT"

for m in $MELS; do
  for s in $STACKS; do
    for k in $KS; do
      dir=$OUT/s$s-k$k-m$m
      "$PY" -m omnicore_audio_mel.fit --audio "$R/*_[5-9].wav" "$R/*_1[0-9].wav" "$R/*_2[0-4].wav" --held-out "$R/*_[0-4].wav" \
        --out "$dir" --overwrite --config "{\"stack\": $s, \"num_codebooks\": $k, \"n_mels\": $m, \"codebook_size\": 256}" > "$OUT/fit-s$s-k$k-m$m.log"
      mv "$OUT/fit-s$s-k$k-m$m.log" "$dir/fit.log"
      unq=()
      first_s=${STACKS%% *} first_k=${KS%% *}
      if [ "${UNQUANTISED:-1}" = 1 ] && [ "$s" = "$first_s" ] && [ "$k" = "$first_k" ]; then unq=(--unquantised); fi
      "$PY" examples/digits/judge_spoken.py ceiling --tokenizer "$dir" --out "$dir/ceiling.json" "${unq[@]}" > /dev/null
      echo "   $dir: $(sed -n 's/^held-out.*used: //p' "$dir/fit.log" | awk '{print $NF}') dB, ceiling $(sed -n 's/^  "accuracy": //p' "$dir/ceiling.json" | sed -n 2p | tr -d ,)" >&2
    done
  done
done

"$PY" - "$OUT" <<'EOF'
import json, sys
from pathlib import Path

rows = []
for d in sorted(Path(sys.argv[1]).glob("s*-k*-m*")):
    c = json.loads((d / "ceiling.json").read_text())
    held = [ln for ln in (d / "fit.log").read_text().splitlines() if ln.startswith("held-out")][0]
    rows.append((c["n_mels"], c["stack"], c["codes_per_frame"], c, float(held.split()[-1])))
print("| mels | stack | frames/s | codes/frame (K) | codes/s | held-out log-mel L1 (dB) | ceiling |")
print("|---:|---:|---:|---:|---:|---:|---:|")
for m, s, k, c, l1 in sorted(rows, key=lambda r: (r[0], -r[1], r[2])):
    fps = c["frames_per_second"]
    print(f"| {m} | {s} | {fps:g} | {k} | {fps * k:g} | {l1:.2f} | {c['through_tokenizer']['accuracy']:.3f} |")
unquantised = {m: c for m, _, _, c, _ in rows if "unquantised" in c}
for m, c in sorted(unquantised.items()):
    print(f"| {m} | - | (no codes) | - | - | 0 | {c['unquantised']['accuracy']:.3f} (log-mel -> Griffin-Lim) |")
print(f"\nheld-out FSDD as is: {rows[0][3]['as_is']['accuracy']:.3f}")
EOF
