#!/usr/bin/env bash
# The main job: set up, then start the embedded metadata store and run the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/scriba demo "$@"
