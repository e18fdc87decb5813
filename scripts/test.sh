#!/usr/bin/env bash
# Set up (idempotent), lint, then run the whole test suite. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ] && ! dpkg -s zookeeper >/dev/null 2>&1; then
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q zookeeper iproute2
fi
./scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/mypy scriba meta placement bookie client stream
.venv/bin/python -m scriba.proto.generate --check
.venv/bin/python -m pytest -p no:cacheprovider --durations=25 "$@"
