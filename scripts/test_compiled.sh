#!/usr/bin/env bash
# The compiled build of the core (issue 15): build the mypyc wheel from this
# checkout (PROCESSOR_MYPYC=1, setup.py), install it into a throw-away venv
# and run the core, agent and CLI tests against it, plus the parity test that
# folds generated logs and the corpus both compiled and from the pure source.
# The pure package stays the single source and the default build; this only
# proves the compiled one is the same program.  About a minute on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
"$PY" -c "import wheel" 2>/dev/null || "$PY" -m pip install -q --disable-pip-version-check wheel
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
echo "== mypyc wheel"
# a copy, so the build's folders never land in the checkout
tar -cf - --exclude=__pycache__ processor schemas deploy/kafka setup.py pyproject.toml \
  README.md MANIFEST.in | tar -xf - -C "$WORK" --one-top-level=src
(cd "$WORK/src" && PROCESSOR_MYPYC=1 "$PY" -m pip wheel -q --disable-pip-version-check \
  --no-build-isolation --no-deps -w "$WORK/dist" .)
# the test dependencies come from the system site (they are installed there)
"$PY" -m venv --system-site-packages "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
  "$WORK"/dist/processor-*.whl
# run outside the checkout, so `import processor` finds the installed wheel
mkdir "$WORK/run"
cp -r tests pyproject.toml "$WORK/run/"
cd "$WORK/run"
"$WORK/venv/bin/python" - <<'EOF'
import processor.core.session as s, processor.core.event_checks as c
for m in (s, c):
    assert not m.__file__.endswith(".py"), f"not the compiled build: {m.__file__}"
print("== compiled:", s.__file__)
EOF
echo "== pytest (compiled build)"
# (the example-log test reads processor/examples from the checkout's layout)
PROCESSOR_PURE_SOURCE="$ROOT" "$WORK/venv/bin/python" -m pytest -q -p no:cacheprovider \
  tests/core tests/agent tests/cli -rs \
  --deselect tests/cli/test_fold_cli.py::test_example_log_folds "$@"
echo "== pytest (compiled build: the engine's broker-less tests)"
cp -r "$ROOT/bench" "$WORK/run/"  # (test_write_amp_count uses the bench's workload)
"$WORK/venv/bin/python" -m pytest -q -p no:cacheprovider -m "not kafka" \
  tests/engine tests/service/test_avro_compiled.py tests/service/test_avro_fast.py \
  tests/service/test_avro_event.py \
  tests/service/test_memory_transport.py
