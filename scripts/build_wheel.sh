#!/usr/bin/env bash
# The wheel that ships (issue 15): the processor with its strictly typed hot
# modules compiled by mypyc (PROCESSOR_MYPYC=1, setup.py; mypy pinned in
# pyproject.toml's build requirements), plus the wheels of its dependencies,
# into OUT.  This is the container's build stage (deploy/container/Dockerfile)
# run on the host: the same files, the same `pip wheel` in build isolation.
# It builds in a copy of those files, so no build/ or *.egg-info ever lands in
# the checkout.  Needs a C compiler and Python headers (the container uses the
# non-slim python image for that stage).
#   scripts/build_wheel.sh OUT          compiled processor wheel + dependency wheels
#   scripts/build_wheel.sh OUT --pure   the pure-Python fallback instead
#   ... --no-deps                       only the processor wheel
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: $0 OUT [--pure] [--no-deps]" >&2; exit 2; }
OUT=$(mkdir -p "$1" && cd "$1" && pwd)
shift
# the compiler type-checks against the dependencies of the environment it runs
# in: the project environment (scripts/venv.sh) when there is one
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x "$PWD/.venv/bin/python" ]; then PY=$PWD/.venv/bin/python; else PY=python3; fi
fi
MYPYC=1
deps=()
for arg in "$@"; do
  case "$arg" in
    --pure) MYPYC=0 ;;
    --no-deps) deps=(--no-deps) ;;
    *) echo "unknown option: $arg" >&2; exit 2 ;;
  esac
done
SRC=$(mktemp -d)
trap 'rm -rf "$SRC"' EXIT
# the files the Dockerfile's build stage COPYs (tests/deploy/test_wheel.py checks they agree)
FILES=(pyproject.toml setup.py MANIFEST.in README.md processor schemas
       deploy/kafka/pom.xml deploy/kafka/log4j2.properties)
tar -cf - --exclude=__pycache__ --exclude='*.so' "${FILES[@]}" | tar -xf - -C "$SRC"
(cd "$SRC" && PROCESSOR_MYPYC=$MYPYC "$PY" -m pip wheel -q --disable-pip-version-check \
  "${deps[@]}" --wheel-dir "$OUT" .)
ls "$OUT"/processor-*.whl
