#!/usr/bin/env bash
# The whole test suite: install, lint, type-check, then pytest (pure core + real Kafka).
# The Kafka tests start a local KRaft broker from Maven Central jars unless
# KAFKA_BOOTSTRAP_SERVERS names a cluster (see deploy/kafka/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import processor, pytest, hypothesis, confluent_kafka, mypy, ruff" 2>/dev/null \
   || [ "${PROCESSOR_REINSTALL:-0}" = 1 ] || [ -n "${CI:-}" ]; then
  "$PY" -m pip install -q --disable-pip-version-check -e ".[test]"
fi
echo "== ruff"
"$PY" -m ruff check processor tests bench
echo "== mypy (strict on the pure core)"
"$PY" -m mypy processor
echo "== pytest"
# The fault suite (tests/faults, marker `faults`: a local 3-node cluster, members
# and brokers killed) runs here in its bounded form, 3-4 minutes on 2 cores.
# PROCESSOR_FAULTS=long (+ PROCESSOR_FAULTS_SECONDS) is the bench-machine form,
# PROCESSOR_FAULTS=skip leaves it out (README "Fault suite").
export PROCESSOR_FAULTS="${PROCESSOR_FAULTS:-bounded}"
exec "$PY" -m pytest "$@"
