#!/usr/bin/env bash
# The whole test suite on the build that ships (issue 15): the compiled wheel
# (scripts/build_wheel.sh, the container's build step; or the wheelhouse named
# by PROCESSOR_WHEELHOUSE, which scripts/test.sh builds once for both runs of
# tests/deploy/test_wheel.py) installed into a throw-away venv, and pytest run
# outside the checkout so that `import processor` (and every `python -m
# processor` the tests start) is the installed compiled package.  The run
# folder is the checkout's files less processor/; PROCESSOR_PURE_SOURCE names
# the checkout only for the parity test, which folds the same logs both
# compiled and from the pure source.  pytest arguments pass through;
# PROCESSOR_TEST_WORKERS=N runs them in N workers (scripts/test.sh: 3).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-$ROOT/.venv/bin/python}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
HOUSE=${PROCESSOR_WHEELHOUSE:-}
if [ -z "$HOUSE" ]; then
  echo "== compiled wheel (scripts/build_wheel.sh)"
  HOUSE="$WORK/wheels"
  bash scripts/build_wheel.sh "$HOUSE" --no-deps
fi
# a throw-away venv from the project environment's interpreter, holding the
# compiled package alone; the test dependencies come from the project
# environment through a .pth line (its own .pth files, the editable install of
# the checkout among them, are not read: `processor` is the wheel's)
"$PY" -m venv "$WORK/venv"
deps=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
site=$("$WORK/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$deps" > "$site/processor-test-deps.pth"
# --ignore-installed: the project environment holds the checkout's editable install
"$WORK/venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --ignore-installed \
  --no-index --find-links "$HOUSE" processor
# the checkout without the package (tracked and new files; no .git, no venvs)
mkdir "$WORK/run"
git ls-files -z -co --exclude-standard | grep -zv '^processor/' \
  | tar --null -T - -cf - | tar -xf - -C "$WORK/run"
cd "$WORK/run"
"$WORK/venv/bin/python" - <<'PY'
import processor.core.session as s, processor.engine.engine as e
for m in (s, e):
    assert not m.__file__.endswith(".py"), f"not the compiled build: {m.__file__}"
print("== compiled:", s.__file__)
PY
export PROCESSOR_FAULTS="${PROCESSOR_FAULTS:-bounded}"
export PROCESSOR_PURE_SOURCE="$ROOT"
WORKERS=${PROCESSOR_TEST_WORKERS:-0}
if [ "$WORKERS" = 0 ]; then
  echo "== pytest (compiled build, the whole suite)"
  "$WORK/venv/bin/python" -m pytest -p no:cacheprovider "$@"
  exit
fi
# PROCESSOR_TEST_WORKERS=N: every test but the fault suite in N workers (each
# test file in one worker, one broker for all: tests/conftest.py), then the
# fault suite alone, whose kills and deadlines should not share the machine
echo "== pytest (compiled build, all but the fault suite, $WORKERS workers)"
rc=0
"$WORK/venv/bin/python" -m pytest -p no:cacheprovider -n "$WORKERS" --dist loadgroup \
  -m "not faults" "$@" || rc=$?
if [ "$PROCESSOR_FAULTS" != skip ]; then
  echo "== pytest (compiled build, the fault suite)"
  "$WORK/venv/bin/python" -m pytest -p no:cacheprovider -m faults "$@" || rc=$?
fi
exit "$rc"
