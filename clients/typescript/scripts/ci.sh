#!/usr/bin/env bash
# The TypeScript subscriber's whole check, as CI runs it (one command from the
# repository root: `bash clients/typescript/scripts/ci.sh`): install from the
# lockfile, check formatting (prettier), build, then every test: unit, conformance corpus
# (clients/conformance/views) and live (a real broker and the repository's
# processor).  The live tests use KAFKA_BOOTSTRAP_SERVERS when set, else a
# local broker started here (python -m processor.devbroker) and stopped at
# the end.  PYTHON: the interpreter that has the processor installed
# (default python3, as scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
npm ci --no-audit --no-fund
if [ -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ]; then
  broker_dir=$(mktemp -d)
  trap '"$PY" -m processor.devbroker stop --dir "$broker_dir" --purge >/dev/null 2>&1 || true' EXIT
  KAFKA_BOOTSTRAP_SERVERS=$("$PY" -m processor.devbroker start --dir "$broker_dir")
  export KAFKA_BOOTSTRAP_SERVERS
fi
npm run lint
PROCESSOR_PYTHON="$PY" npm test
