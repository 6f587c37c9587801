#!/usr/bin/env bash
# The main job end to end: make or reuse the project environment (.venv at the
# checkout's root, from $PYTHON, default python3; scripts/venv.sh), then
# `processor demo` (starts a local Kafka broker when KAFKA_BOOTSTRAP_SERVERS is
# not set).  Afterwards the commands are `.venv/bin/processor ...`.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/venv.sh
source scripts/venv.sh
project_venv ""
exec "$VENV_PY" -m processor demo "$@"
