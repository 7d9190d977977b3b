#!/usr/bin/env bash
# Set up .venv if needed, then run the whole test suite (core and first-party plugins).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
exec .venv/bin/python -m pytest "$@"
