#!/usr/bin/env bash
# The main job end to end: install, then `processor demo` (starts a local Kafka
# broker when KAFKA_BOOTSTRAP_SERVERS is not set).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import processor.cli.main, confluent_kafka, fastavro, starlette, uvicorn" 2>/dev/null; then
  PROCESSOR_MYPYC=0 "$PY" -m pip install -q --disable-pip-version-check -e .
fi
exec "$PY" -m processor demo "$@"
