#!/usr/bin/env bash
# Build a wheel and an sdist of the core and of every plugin and contrib package, then check their
# metadata (scripts/check_dist.py: licence, readme, classifiers, Python versions, the core API range
# as the plugins' dependency omnicore>=0.1,<0.2).
#
#   bash scripts/build_dist.sh [--out DIR]   DIR defaults to dist/ (gitignored)
#   PYTHON=...                                the interpreter that builds (default .venv/bin/python)
#   BUILD_JOBS=N                              builds at a time (default: the number of CPUs)
#
# A project is the repository root or a folder plugins/* or contrib/* with a pyproject.toml (the copier
# template is not one). `python -m build --no-isolation` builds with the environment's setuptools and
# downloads nothing; it builds each wheel from its sdist, so a file missing from an sdist fails here.
# The *.whl and *.tar.gz already in DIR are removed first; nothing else there is touched. Then:
#   pip install --find-links DIR omnicore-audio-whisper   (pulls the core from DIR too)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
JOBS=${BUILD_JOBS:-$(nproc)}
OUT=dist

die() { echo "build_dist: error: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case $1 in
    --out) [ $# -ge 2 ] || die "--out needs a folder"; OUT=$2; shift 2 ;;
    *) die "unknown argument '$1' (usage: bash scripts/build_dist.sh [--out DIR])" ;;
  esac
done

# Every pyproject's build-system asks for setuptools>=77 (licence as an SPDX expression): checked once
# here, so that each build may skip its own (-x: two fewer backend calls per build).
"$PY" -c 'import build, setuptools, sys; sys.exit(int(setuptools.__version__.split(".")[0]) < 77)' 2>/dev/null \
  || die "$PY lacks build or setuptools>=77: run bash scripts/setup.sh (or $PY -m pip install build 'setuptools>=77')"

PROJECTS=(.)
for p in plugins/*/ contrib/*/; do
  if [ -f "$p/pyproject.toml" ]; then PROJECTS+=("${p%/}"); fi
done

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT"/*.whl "$OUT"/*.tar.gz
LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT

# One build per project, JOBS at a time; each writes its output to LOGS/N.log and, when it worked, LOGS/N.ok.
build_one() {
  if "$PY" -m build --no-isolation --skip-dependency-check --outdir "$OUT" "$2" >"$LOGS/$1.log" 2>&1; then touch "$LOGS/$1.ok"; fi
}
for i in "${!PROJECTS[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
  build_one "$i" "${PROJECTS[$i]}" &
done
wait
failed=0
for i in "${!PROJECTS[@]}"; do
  if [ -f "$LOGS/$i.ok" ]; then
    echo "build_dist: built $(grep -o 'Successfully built .*' "$LOGS/$i.log" | sed 's/Successfully built //')"
  else
    tail -n 30 "$LOGS/$i.log" >&2
    echo "build_dist: error: building ${PROJECTS[$i]} failed (the last lines of its output are above)" >&2
    failed=1
  fi
done
[ "$failed" = 0 ] || exit 1
"$PY" scripts/check_dist.py "$OUT" "${PROJECTS[@]}"
