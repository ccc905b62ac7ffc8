#!/usr/bin/env bash
# The main job on the bundled sample (samples/ocr): set up ./.venv, fetch the OCR weights, serve
# the repository with `toolkit serve`, send it a rendered image of known text through
# tritonclient.http, print what was read, stop the server, then build the container image
# (`toolkit build`; without a container engine, the build context and its build command).
#   scripts/demo.sh     PORT=8000, TARGET=cloudrun|lambda|knative, BASE_IMAGE=... (optional)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
repo=samples/ocr
port=${PORT:-8000}

echo "==> setting up .venv"
scripts/setup.sh

echo "==> preparing $repo (PP-OCRv6 weights from the rapidocr wheel on PyPI, cached)"
.venv/bin/python "$repo/prepare.py"

echo "==> toolkit validate $repo"
.venv/bin/toolkit validate "$repo"

log=$(mktemp -t toolkit-demo-serve.XXXXXX.log)
echo "==> toolkit serve $repo on 127.0.0.1:$port (log: $log)"
.venv/bin/toolkit serve "$repo" --port "$port" --device cpu --log-level warning >"$log" 2>&1 &
server=$!
stop_server() {
  if kill -0 "$server" 2>/dev/null; then
    kill -TERM "$server"   # the server drains and exits by itself
    wait "$server" || true
  fi
}
trap stop_server EXIT

# wait for GET /v2/health/ready to answer 200 (models loaded and warmed up)
if ! .venv/bin/python - "$port" "$server" <<'EOF'
import os, sys, time, urllib.request
port, pid = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as r:
            if r.status == 200:
                sys.exit(0)
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit("the server exited")
    time.sleep(0.1)
sys.exit("the server was not ready after 120 s")
EOF
then
  cat "$log"
  exit 1
fi
echo "==> ready; reading a rendered image"

.venv/bin/python "$repo/client.py" --url "127.0.0.1:$port" --text "HELLO TRITON" "serverless 2026"

echo "==> stopping the server"
stop_server
trap - EXIT
rm -f "$log"

# The product's main job: a container image of the repository. With a container engine (docker,
# podman or buildah) the image is built; without one the build context and the exact build
# command are written instead, and the output says so.
target=${TARGET:-cloudrun}
echo "==> toolkit build $repo --target $target"
builder=none
for engine in docker podman buildah; do
  if command -v "$engine" >/dev/null 2>&1 && "$engine" info >/dev/null 2>&1; then builder=auto; break; fi
done
if [ "$builder" = none ]; then
  echo "    (no running container engine found: writing the build context and the command to build it)"
fi
if ! .venv/bin/toolkit build "$repo" --target "$target" --builder "$builder" ${BASE_IMAGE:+--base-image "$BASE_IMAGE"} -q; then
  if [ "$builder" = none ]; then exit 1; fi
  echo "    the engine could not build the image (see above: usually the base image cannot be pulled;"
  echo "    pass BASE_IMAGE=<an image with Python 3 you have locally>). Writing the context instead:"
  .venv/bin/toolkit build "$repo" --target "$target" --builder none ${BASE_IMAGE:+--base-image "$BASE_IMAGE"} -q
fi
echo "==> done"
