#!/usr/bin/env bash
# A local Apache Kafka broker (KRaft, one node) from Maven Central jars.
# Thin wrapper around processor/devbroker.py; see deploy/kafka/README.md.
#   broker.sh start [--dir D] [--port P] | stop [--dir D] [--purge] | status [--dir D]
#   broker.sh resolve | run [--dir D] [--port P]
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m processor.devbroker "$@"
