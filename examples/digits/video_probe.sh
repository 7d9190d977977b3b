#!/usr/bin/env bash
# The video probe: five.yaml's model on its two seeing tasks alone (image_to_text and video_to_text,
# no audio encoder, no decoders), 1500 steps, then held-out accuracy of both. About 5 minutes on 2
# cores instead of the five-task run's 11-13, and video accuracy comes out near the full run's, so a
# change to the tower, the positions or the clips can be tried here first (the figures it gave are in
# README.md, "The five-task run"). Needs the five-task data: run `TASKS=5 bash examples/digits/run.sh`
# once, or its stages 1 and 2. Extra arguments go to both `omnicore train` and `omnicore eval`, e.g.
#   bash examples/digits/video_probe.sh --model.encoders.video.options.max_frames 4
# The run folder is runs/video-probe (deleted first); OUT=DIR picks another.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
DATA=examples/digits/data5
if [ ! -f "$DATA/train.jsonl" ] || [ ! -f "$DATA/tokenizer/tokenizer.json" ]; then
  echo "video_probe.sh: $DATA has no train.jsonl or fitted tokenizer; run 'TASKS=5 bash examples/digits/run.sh' first" >&2
  exit 2
fi
# the image and video rows of the five-task data, media paths unchanged (relative to data5/)
$PY - "$DATA" <<'PY'
import json
import sys

folder = sys.argv[1]
for split in ("train", "eval"):
    with open(f"{folder}/{split}.jsonl") as f:
        rows = [line for line in f if json.loads(line).get("task") in ("image_to_text", "video_to_text")]
    with open(f"{folder}/probe_{split}.jsonl", "w") as f:
        f.writelines(rows)
    print(f"{folder}/probe_{split}.jsonl: {len(rows)} rows")
PY
OUT=${OUT:-runs/video-probe}
rm -rf "$OUT"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
probe=(--data.train data5/probe_train.jsonl --data.eval data5/probe_eval.jsonl --model.encoders.audio null --model.decoders null
       --samples.every 0 --eval.every 0 --run.output_dir "$OUT")
.venv/bin/omnicore train examples/digits/five.yaml --train.max_steps 1500 --train.save_every 1500 "${probe[@]}" "$@"
.venv/bin/omnicore eval examples/digits/five.yaml --export "$OUT/export" "${probe[@]}" "$@"
