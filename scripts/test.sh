#!/usr/bin/env bash
# Set up .venv if needed, then run the test suite (core and first-party plugins).
#   bash scripts/test.sh [PYTEST ARGS]           the whole suite (what CI runs)
#   bash scripts/test.sh --quick [PYTEST ARGS]   the quick lane: leaves out the tests marked
#       multiprocess, cli or slow (the markers of [tool.pytest.ini_options] in pyproject.toml)
set -euo pipefail
cd "$(dirname "$0")/.."
select=()
args=()
for arg in "$@"; do
    if [[ $arg == --quick ]]; then
        select=(-m "not multiprocess and not cli and not slow")
    else
        args+=("$arg")
    fi
done
bash scripts/setup.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
exec .venv/bin/python -m pytest ${select[@]+"${select[@]}"} ${args[@]+"${args[@]}"}
