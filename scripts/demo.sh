#!/usr/bin/env bash
# The main job on the bundled sample: set up ./.venv, validate samples/quickstart and print the
# completed configuration Triton would use.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
scripts/setup.sh
repo=samples/quickstart
echo "==> toolkit validate $repo"
.venv/bin/toolkit validate "$repo"
echo "==> toolkit config $repo add_sub"
.venv/bin/toolkit config "$repo" add_sub
