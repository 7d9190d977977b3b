#!/usr/bin/env bash
# Set up a development environment in .venv: the CPU build of torch, omnicore and the first-party
# plugins (editable), pytest, ruff (lint and format, run by the tests), and accelerate (the bench
# extra). Safe to run again: it re-installs only when a pyproject or this script changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${OMNICORE_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  echo "creating $VENV"
  "$PY" -m venv "$VENV"
fi
PLUGINS=(plugins/omnicore-audio-whisper plugins/omnicore-image-siglip plugins/omnicore-image-movqgan contrib/omnicore-parallel-offload plugins/omnicore-parallel-ulysses plugins/omnicore-parallel-comet plugins/omnicore-kernels-flash-attn plugins/omnicore-kernels-liger plugins/omnicore-logger-tensorboard)
stamp="$VENV/.omnicore-setup"
want=$(cat pyproject.toml "${PLUGINS[@]/%//pyproject.toml}" scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
pip_install() { "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$@"; }
# torch first and pinned: a looser requirement would pull a multi-GB CUDA build on CPU machines.
pip_install "torch==2.13.0"
editable=(-e ".[bench]")  # the bench extra: accelerate, for the Trainer baseline of bench/run.py
for p in "${PLUGINS[@]}"; do editable+=(-e "$p"); done
pip_install "torch==2.13.0" "${editable[@]}" "pytest>=8" "copier==9.19.1" "ruff==0.14.14"
echo "$want" > "$stamp"
echo "environment ready: $VENV ($("$VENV/bin/python" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
