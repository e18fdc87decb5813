#!/usr/bin/env bash
# Set up (idempotent), lint, then run the whole test suite. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ] && { ! dpkg -s zookeeper >/dev/null 2>&1 || ! dpkg -s etcd-client >/dev/null 2>&1 || ! dpkg -s chromium >/dev/null 2>&1 || ! dpkg -s chromium-driver >/dev/null 2>&1; }; then
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q zookeeper iproute2 etcd-client chromium chromium-driver
fi
./scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/python -m scriba.testing.typecheck  # mypy over the package as installed (cross-layer calls checked)
.venv/bin/python -m scriba.proto.generate --check
.venv/bin/python -m pytest -p no:cacheprovider --durations=25 "$@"
# The mutation gate (tests/mutants.toml): every listed mutant of the safety rules must be
# killed by the fast tests it names. Runs with the whole suite; SCRIBA_MUTATION=0 skips it.
if [ $# -eq 0 ] && [ "${SCRIBA_MUTATION:-1}" != 0 ]; then
  .venv/bin/python -m scriba.testing.mutation tests/mutants.toml --jobs 2
fi
