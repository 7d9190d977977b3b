#!/usr/bin/env bash
# Set up a development environment in .venv: torch, omnicore and the first-party plugins (editable),
# pytest, ruff (lint and format, run by the tests), mypy (the type-checker test), build (scripts/build_dist.sh) and accelerate (the
# bench extra). Safe to run again: it re-installs only when a pyproject, this script or the device
# choice changed.
#
#   OMNICORE_DEVICE=auto|cpu|cuda  auto (the default) is cuda when `nvidia-smi -L` lists a GPU, else cpu.
#       cpu:  torch==2.13.0 from pip's configured indexes (what CI runs).
#       cuda: torch==2.13.0 from the PyTorch CUDA index that the driver and the GPU can run, then the
#             `gpu` extras of the Liger and flash-attn kernel plugins. A flash-attn that does not
#             install is a warning, not a failure: the sdpa attention kernels work without it.
#   OMNICORE_TORCH_INDEX=URL  take torch from this index instead (either device).
#   OMNICORE_FLASH_ATTN=0     on cuda, leave flash-attn out (it compiles for long where no wheel fits).
#   OMNICORE_VENV=DIR         the environment (default .venv); PYTHON=python3.X is what creates it.
#   --dry-run, or OMNICORE_SETUP_DRY_RUN=1: print the commands instead of running them; writes nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${OMNICORE_VENV:-.venv}
DRY_RUN=${OMNICORE_SETUP_DRY_RUN:-0}
TORCH=2.13.0
# torch 2.13's CUDA builds (pytorch/pytorch RELEASE.md): cu126 (legacy; compute capability 5.0 to 9.0,
# Maxwell to Hopper) and cu130 (stable; 7.5 and up, Turing to Blackwell). The experimental cu132 is
# there for the asking: OMNICORE_TORCH_INDEX=https://download.pytorch.org/whl/cu132.
TORCH_CUDA_INDEX=https://download.pytorch.org/whl
GPU_EXTRAS=(plugins/omnicore-kernels-liger)         # installed with their `gpu` extra on cuda
FLASH_ATTN_PLUGIN=plugins/omnicore-kernels-flash-attn  # its `gpu` extra goes last, on its own
PLUGINS=(plugins/omnicore-family-kit plugins/omnicore-audio-whisper plugins/omnicore-image-siglip plugins/omnicore-image-movqgan plugins/omnicore-audio-codec plugins/omnicore-audio-mel plugins/omnicore-video-frames contrib/omnicore-parallel-offload plugins/omnicore-parallel-ulysses plugins/omnicore-parallel-comet plugins/omnicore-parallel-encoder-balance plugins/omnicore-kernels-flash-attn plugins/omnicore-kernels-liger plugins/omnicore-logger-tensorboard plugins/omnicore-logger-wandb plugins/omnicore-logger-mlflow plugins/omnicore-family-qwen2-audio plugins/omnicore-family-llava plugins/omnicore-family-qwen2-vl plugins/omnicore-family-qwen3-vl plugins/omnicore-family-qwen2-5-omni plugins/omnicore-family-csm)

say() { echo "setup: $*"; }
die() { echo "setup: error: $*" >&2; exit 2; }
run() { if [ "$DRY_RUN" = 1 ]; then echo "+ $(quoted "$@")"; else "$@"; fi; }  # run it, or print it (--dry-run)
quoted() {  # the words as one line to paste into a shell: '.[bench]' and 'pytest>=8' in single quotes
  local w out=()
  for w in "$@"; do if [[ $w =~ [^A-Za-z0-9_./=:+,@-] ]]; then out+=("'$w'"); else out+=("$w"); fi; done
  echo "${out[*]}"
}
pip_install() { run "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$@"; }
smi() { nvidia-smi "$@" 2>/dev/null; }  # fails, printing nothing, where there is no driver
version() { echo "$(($1 / 100)).$(($1 % 100))"; }  # 1300 -> 13.0

parse_args() {
  local arg
  for arg in "$@"; do
    case $arg in
      --dry-run) DRY_RUN=1 ;;
      *) die "unknown argument '$arg' (the only one is --dry-run; the rest are OMNICORE_* variables, see the top of $0)" ;;
    esac
  done
}

# Reads nvidia-smi into GPUS (how many it lists), DRIVER_CUDA (the newest CUDA the driver runs, as
# 100 * major + minor: 1300 for 13.0) and CAPABILITY (the first GPU's compute capability, 900 for
# 9.0); the last two are empty where nvidia-smi cannot say.
read_gpu() {
  local v
  GPUS=$({ smi -L || true; } | grep -c '^GPU ' || true)
  v=$({ smi || true; } | grep -oE 'CUDA Version: *[0-9]+\.[0-9]+' | grep -oE '[0-9]+\.[0-9]+' | head -n1 || true)
  DRIVER_CUDA=${v:+$((${v%%.*} * 100 + 10#${v#*.}))}
  v=$({ smi --query-gpu=compute_cap --format=csv,noheader || true; } | grep -oE '^[0-9]+\.[0-9]+' | head -n1 || true)
  CAPABILITY=${v:+$((${v%%.*} * 100 + 10#${v#*.}))}
}

# Sets DEVICE to cpu or cuda from OMNICORE_DEVICE and, for auto, from whether nvidia-smi lists a GPU.
choose_device() {
  read_gpu
  case ${OMNICORE_DEVICE:-auto} in
    cpu | cuda) DEVICE=$OMNICORE_DEVICE ;;
    auto) if [ "$GPUS" -gt 0 ]; then DEVICE=cuda; else DEVICE=cpu; fi ;;
    *) die "OMNICORE_DEVICE must be auto, cpu or cuda, not '$OMNICORE_DEVICE'" ;;
  esac
}

# Sets CUDA_BUILD to the torch CUDA build this machine runs: cu130 where the driver runs CUDA 13.0 and
# the GPU is Turing or newer, cu126 for a 12.x driver (minor-version compatibility) or an older GPU.
pick_cuda_build() {
  local gpu drv
  gpu="compute capability $(version "${CAPABILITY:-0}")"
  drv="the driver runs CUDA $(version "${DRIVER_CUDA:-0}")"
  if [ -z "$DRIVER_CUDA" ]; then
    CUDA_BUILD=cu130  # no driver to ask (building an image, say): the stable build
  elif [ -n "$CAPABILITY" ] && [ "$CAPABILITY" -lt 705 ] && [ "$DRIVER_CUDA" -ge 1200 ]; then
    CUDA_BUILD=cu126  # Maxwell to Volta: only the cu126 build has kernels for them
  elif [ "$DRIVER_CUDA" -ge 1300 ]; then
    CUDA_BUILD=cu130
  elif [ -n "$CAPABILITY" ] && [ "$CAPABILITY" -ge 1000 ]; then
    die "this GPU ($gpu) needs torch's cu130 build, but $drv: update the NVIDIA driver (580 or newer), or set OMNICORE_TORCH_INDEX"
  elif [ "$DRIVER_CUDA" -ge 1200 ]; then
    CUDA_BUILD=cu126
  else
    die "torch $TORCH needs an NVIDIA driver for CUDA 12.0 or newer, but $drv: update the driver, or set OMNICORE_DEVICE=cpu"
  fi
}

# Sets TORCH_INDEX: OMNICORE_TORCH_INDEX if set; on cuda the matching PyTorch CUDA index; on cpu
# nothing (pip's configured indexes, as CI uses).
choose_torch_index() {
  TORCH_INDEX=${OMNICORE_TORCH_INDEX:-}
  if [ -z "$TORCH_INDEX" ] && [ "$DEVICE" = cuda ]; then
    pick_cuda_build
    TORCH_INDEX=$TORCH_CUDA_INDEX/$CUDA_BUILD
  fi
}

describe_choice() {
  local found="no GPU listed by nvidia-smi"
  [ "$GPUS" -eq 0 ] || found="$GPUS GPU(s)${CAPABILITY:+, compute capability $(version "$CAPABILITY")}${DRIVER_CUDA:+, driver for CUDA $(version "$DRIVER_CUDA")}"
  say "device $DEVICE (OMNICORE_DEVICE=${OMNICORE_DEVICE:-auto}; $found); torch $TORCH from ${TORCH_INDEX:-the indexes pip is configured with}"
}

# The stamp: every pyproject, this script and the device choice, so that switching re-installs.
setup_hash() {
  { cat pyproject.toml "${PLUGINS[@]/%//pyproject.toml}" scripts/setup.sh
    echo "device=$DEVICE index=$TORCH_INDEX flash_attn=${OMNICORE_FLASH_ATTN:-1}"; } | sha256sum | cut -c1-16
}

# The installed torch's version (2.13.0+cpu), read from its metadata without importing it; empty if none.
installed_torch() {
  "$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true
}

# True when the installed torch is another device's build. pip alone would keep it (2.13.0+cpu
# satisfies torch==2.13.0), so a switch of device removes it first.
torch_is_other_build() {
  local have=$1 label=${TORCH_INDEX%/}
  [ -n "$have" ] || return 1
  if [ -n "$TORCH_INDEX" ]; then [ "$have" != "$TORCH+${label##*/}" ]; else [[ $have == *+cu* ]]; fi
}

install_torch() {
  local have
  have=$(installed_torch)
  if torch_is_other_build "$have"; then
    say "replacing torch $have, another device's build"
    run "$VENV/bin/python" -m pip uninstall --quiet --yes torch
  fi
  # torch first and pinned: a looser requirement would pull a multi-GB CUDA build on CPU machines.
  pip_install "torch==$TORCH" ${TORCH_INDEX:+--index-url "$TORCH_INDEX"}
}

install_packages() {
  local editable=(-e ".[bench]") p x  # the bench extra: accelerate, for the Trainer baseline of bench/run.py
  for p in "${PLUGINS[@]}"; do
    if [ "$DEVICE" = cuda ]; then
      for x in "${GPU_EXTRAS[@]}"; do [ "$x" != "$p" ] || p="${p}[gpu]"; done
    fi
    editable+=(-e "$p")
  done
  pip_install "torch==$TORCH" "${editable[@]}" "pytest>=8" "copier==9.19.1" "ruff==0.14.14" "mypy==1.19.1" "build==1.6.1"
}

# flash-attn builds against the installed torch: its build imports torch, packaging, psutil and ninja
# from the environment (hence no build isolation) and fetches a prebuilt wheel when one matches
# torch, CUDA and Python, or else compiles with nvcc. A failure is a warning: sdpa works without it.
install_flash_attn() {
  local log="$VENV/flash-attn-install.log"
  if [ "${OMNICORE_FLASH_ATTN:-1}" = 0 ]; then
    say "leaving flash-attn out (OMNICORE_FLASH_ATTN=0)"
    return 0
  fi
  pip_install packaging psutil ninja wheel "setuptools>=68"
  say "installing flash-attn (a prebuilt wheel where one matches, else a long compile; log: $log)"
  if [ "$DRY_RUN" = 1 ]; then
    pip_install --no-build-isolation -e "${FLASH_ATTN_PLUGIN}[gpu]"
  elif pip_install --no-build-isolation -e "${FLASH_ATTN_PLUGIN}[gpu]" >"$log" 2>&1; then
    say "flash-attn installed"
  else
    warn_flash_attn $? "$log"
  fi
}

warn_flash_attn() {
  local python
  python=$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo "?")
  cat >&2 <<EOF
setup: warning: flash-attn did not install (pip exit status $1; its output is in $2).
  The rest of the set-up is complete, and the sdpa and sdpa_varlen attention kernels work without it
  (\`omnicore plugins\` lists flash_attn as unavailable). To add it later, either
  - install a flash-attn wheel built for torch ${TORCH%.*}, ${TORCH_INDEX##*/} and Python $python from
    https://github.com/Dao-AILab/flash-attention/releases: $VENV/bin/python -m pip install FILE.whl
  - or compile it, with the CUDA toolkit's nvcc on PATH (MAX_JOBS bounds its memory use):
    MAX_JOBS=4 $VENV/bin/python -m pip install --no-build-isolation -e '${FLASH_ATTN_PLUGIN}[gpu]'
EOF
}

report() {
  local check='import torch, transformers
c = torch.version.cuda
print("torch", torch.__version__, "transformers", transformers.__version__, *(["CUDA", c, "GPU available:", torch.cuda.is_available()] if c else []))'
  echo "environment ready: $VENV ($("$VENV/bin/python" -c "$check"))"
}

main() {
  local stamp="$VENV/.omnicore-setup" want
  parse_args "$@"
  choose_device
  choose_torch_index
  want=$(setup_hash)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    if [ "$DRY_RUN" = 1 ]; then say "$VENV is up to date: nothing to do"; fi
    return 0
  fi
  describe_choice
  if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV"
    run "$PY" -m venv "$VENV"
  fi
  install_torch
  install_packages
  if [ "$DEVICE" = cuda ]; then install_flash_attn; fi
  if [ "$DRY_RUN" = 1 ]; then
    echo "+ echo $want > $stamp"
  else
    echo "$want" >"$stamp"
    report
  fi
}

main "$@"
