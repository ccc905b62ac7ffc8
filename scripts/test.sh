#!/usr/bin/env bash
# Sets up ./.venv (first run: a minute or two) and runs the test suite.
# Extra arguments go to pytest, e.g. scripts/test.sh -k batcher -x
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
