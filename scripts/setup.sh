#!/usr/bin/env bash
# Creates ./.venv (idempotent) and installs the project with the extras named in $TOOLKIT_EXTRAS
# (default: dev, which brings cpu onnxruntime and every test dependency), then builds the native
# gRPC front end when it can (scripts/grpc-native.sh; TOOLKIT_GRPC_NATIVE=0 skips it) and the
# native HTTP front end (scripts/http-native.sh; TOOLKIT_HTTP_NATIVE=0 skips it).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
extras=${TOOLKIT_EXTRAS:-dev}
py=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
stamp=.venv/.toolkit-installed
want="$extras $(sha256sum pyproject.toml | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -m pip install -q -e ".[$extras]" 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -c "import toolkit, handlers" 
  echo "$want" > "$stamp"
fi
scripts/grpc-native.sh
scripts/http-native.sh
