#!/usr/bin/env bash
# The whole test suite, in the project environment (.venv, scripts/venv.sh):
#   1. lint and types, while the shipped build (the compiled wheel) is built;
#   2. every test once on the shipped build (scripts/test_compiled.sh): the
#      Kafka, fault and browser tests included;
#   3. at the same time, the layers whose code the compiler changes (the pure
#      tests: no broker, no browser) again on the pure source, the fallback a
#      plain `pip install .` gives, with the compiled-vs-pure parity test; then
#      the TypeScript subscriber's tests (clients/typescript/scripts/ci.sh).
# The Kafka tests start a local KRaft broker from Maven Central jars unless
# KAFKA_BOOTSTRAP_SERVERS names a cluster (see deploy/kafka/README.md).
# Arguments pass to both pytest runs (e.g. -x, -k NAME).
#   PROCESSOR_COMPILED=0   only the pure source, every test (no wheel build)
#   PROCESSOR_FAULTS=skip  leave the fault suite out (docs/testing.md)
#   PROCESSOR_TEST_WORKERS=N  pytest workers of the compiled run (default 3;
#                          0: one process); the fault suite always runs alone
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
# Debian packages the tests need, installed when missing (CI: a fresh Debian
# machine, as root): prometheus (promtool and the server, tests/deploy),
# chromium and chromium-driver (the page tests), python3-venv (the project
# environment and the wheel test's fresh venv with the system Python).
need=()
{ command -v promtool && command -v prometheus; } >/dev/null 2>&1 || need+=(prometheus)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
if [ -x /usr/bin/python3 ] && ! /usr/bin/python3 -c "import ensurepip, venv" >/dev/null 2>&1; then
  need+=(python3-venv)
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== apt-get install ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
  else
    echo "missing Debian packages (install them as root): ${need[*]}" >&2
  fi
fi
# shellcheck source=scripts/venv.sh
source scripts/venv.sh
project_venv test
PY=$VENV_PY
export PROCESSOR_FAULTS="${PROCESSOR_FAULTS:-bounded}"
# In CI the fault suite keeps its cluster (node logs with the coordinators at
# DEBUG, data dirs) and member logs, replaced by the next CI run: a chaos
# failure seen only there can be read afterwards with
# `python3 -m tests.faults.diagnose <dir>` (tests/faults/conftest.py).
if [ -n "${CI:-}" ]; then
  export PROCESSOR_FAULTS_KEEP=${TMPDIR:-/tmp}/processor-ci-faults
  rm -rf "$PROCESSOR_FAULTS_KEEP"
  export PROCESSOR_KAFKA_LOG4J="$PWD/tests/faults/log4j2-debug.properties"
fi
LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS" "${PROCESSOR_WHEELHOUSE:-/nonexistent-wheelhouse}"' EXIT
lint() {
  "$PY" -m ruff check processor tests bench
  "$PY" -m ruff format --check processor tests bench
  "$PY" -m mypy processor
  "$PY" -m mypy tests
  "$PY" -m mypy bench
}
if [ "${PROCESSOR_COMPILED:-1}" = 0 ]; then
  echo "== ruff, mypy"
  lint
  echo "== pytest, pure source (the checkout), every test"
  exec "$PY" -m pytest "$@"
fi
echo "== ruff, mypy; the compiled wheel (scripts/build_wheel.sh, as the container builds it)"
PROCESSOR_WHEELHOUSE=$(mktemp -d)
export PROCESSOR_WHEELHOUSE
lint > "$LOGS/lint" 2>&1 &
lint_pid=$!
PYTHON=$PY bash scripts/build_wheel.sh "$PROCESSOR_WHEELHOUSE"
lint_rc=0
wait "$lint_pid" || lint_rc=$?
cat "$LOGS/lint"
[ "$lint_rc" = 0 ] || { echo "== lint or types failed" >&2; exit "$lint_rc"; }
echo "== lint, types and wheel: $((SECONDS - started)) s"
# the pure layers on the pure source, beside the compiled run: that run mostly
# waits on brokers, this one mostly computes
echo "== in the background: pytest on the pure source (the pure tests), then the TypeScript subscriber"
background() {
  local rc=0
  "$PY" -m pytest -p no:cacheprovider -m "not kafka and not faults and not browser" \
    --ignore=tests/deploy "$@" > "$LOGS/pure" 2>&1 || rc=$?
  # clients/typescript: npm ci, prettier, build, unit + conformance corpus + a
  # live broker (its own when KAFKA_BOOTSTRAP_SERVERS is not set)
  PYTHON=$PY bash clients/typescript/scripts/ci.sh > "$LOGS/typescript" 2>&1 || rc=$?
  return "$rc"
}
background "$@" &
pure_pid=$!
echo "== pytest, compiled build (the installed wheel, outside the checkout): every test"
rc=0
PROCESSOR_TEST_WORKERS=${PROCESSOR_TEST_WORKERS:-3} PYTHON=$PY bash scripts/test_compiled.sh "$@" || rc=$?
pure_rc=0
wait "$pure_pid" || pure_rc=$?
echo "== pytest, pure source (the checkout): the pure tests"
cat "$LOGS/pure"
echo "== clients/typescript (scripts/ci.sh)"
cat "$LOGS/typescript"
echo "== total: $((SECONDS - started)) s"
# both runs always run (one CI run tells about both builds); either failing fails it
[ "$rc" != 0 ] || rc=$pure_rc
exit "$rc"
