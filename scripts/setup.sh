#!/usr/bin/env bash
# Create .venv and install Scriba with its test and spark extras (idempotent).
# pip's output goes to .venv/install.log and is printed only if the install fails.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ] && ! command -v java >/dev/null 2>&1; then
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q default-jre-headless
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
log=.venv/install.log
if ! { .venv/bin/python -m pip install -q --upgrade pip && .venv/bin/python -m pip install -q -e '.[test,spark]'; } >"$log" 2>&1; then
  cat "$log" >&2
  echo "setup: installing Scriba failed (log above, also in $log)" >&2
  exit 1
fi
