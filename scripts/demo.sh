#!/usr/bin/env bash
# The main job: set up, start the sandbox (embedded etcd + 4 bookie processes over
# 3 zones), run `scriba shell simple-test` against it, then stop everything it started.
# Extra args go to `scriba sandbox` (e.g. --bookies 5 --data DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/scriba sandbox --simple-test "$@"
