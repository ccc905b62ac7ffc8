#!/usr/bin/env bash
# Runs tritonclient's own HTTP examples, unchanged, against `toolkit serve`.
#
#   git clone https://github.com/triton-inference-server/client /tmp/client
#   scripts/triton-client-examples.sh /tmp/client            # every src/python/examples/simple_http_*.py
#   scripts/triton-client-examples.sh /tmp/client infer_client string_infer_client   # some of them
#   scripts/triton-client-examples.sh --tritonserver /tmp/client   # the same against tritonserver 2.51
#
# Builds the models the examples expect (samples/make_triton_examples.py: simple, simple_int8,
# simple_string, simple_identity) into a temporary repository, serves it with `toolkit serve` on a
# free port, runs each example with `-u 127.0.0.1:PORT` using the project's .venv (tritonclient[http])
# and prints PASS or FAIL per script (an example passes when it exits 0, as in Triton's own CI).
# Examples that need what the toolkit does not offer are listed below with the reason; they are
# run all the same and reported as "FAIL (expected: ...)". Exit status: the number of other failures.
# --tritonserver serves the same repository with the real tritonserver 2.51 instead
# (scripts/tools/tritonserver, docs/tools.md): the reference the models and the answers follow.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
server=toolkit
if [ "${1:-}" = "--tritonserver" ]; then
  server=tritonserver
  shift
fi
if [ $# -lt 1 ] || [ ! -d "$1/src/python/examples" ]; then
  echo "usage: $0 CLIENT_CHECKOUT [EXAMPLE...]   (a checkout of github.com/triton-inference-server/client)" >&2
  exit 2
fi
examples=$(cd "$1/src/python/examples" && pwd)
shift
cd "$root"
scripts/setup.sh
python=.venv/bin/python

declare -A expected_failure=(
  [model_control]="needs tritonserver --model-control-mode=explicit (load with a config override, unload); toolkit serves the repository it was given and answers load/unload as tritonserver's default mode: 503 'explicit model load / unload is not allowed if polling is enabled'"
  [shm_client]="needs the system shared memory extension (client and server on one host); not implemented: serverless clients never share memory with the server"
  [shm_string_client]="needs the system shared memory extension; not implemented"
  [cudashm_client]="needs a GPU and the CUDA shared memory extension; not implemented"
)

work=$(mktemp -d)
server_pid=
cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill "$server_pid"
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

"$python" samples/make_triton_examples.py "$work/models" >/dev/null
port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
if [ "$server" = toolkit ]; then
  "$python" -m toolkit.cli serve "$work/models" --port "$port" --device cpu --log-level warning >"$work/serve.log" 2>&1 &
else
  scripts/tools/tritonserver --install-only >/dev/null
  scripts/tools/tritonserver serve "$work/models" --http-port "$port" --grpc-port 0 --metrics-port 0 >"$work/serve.log" 2>&1 &
fi
server_pid=$!
export no_proxy="127.0.0.1,localhost${no_proxy:+,$no_proxy}" NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}"
ready() {
  "$python" -c 'import sys, urllib.request as u; u.urlopen(sys.argv[1], timeout=2)' \
    "http://127.0.0.1:$port/v2/health/ready" 2>/dev/null
}
for _ in $(seq 300); do
  ready && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/serve.log" >&2; echo "$server exited" >&2; exit 1; }
  sleep 0.2
done
ready || { cat "$work/serve.log" >&2; echo "$server not ready after 60 s" >&2; exit 1; }
echo "$server serves $work/models on 127.0.0.1:$port; examples from $examples"

if [ $# -gt 0 ]; then
  names=("$@")
else
  names=()
  for file in "$examples"/simple_http_*.py; do
    name=${file##*/simple_http_}
    names+=("${name%.py}")
  done
fi

failed=0
for name in "${names[@]}"; do
  script="$examples/simple_http_$name.py"
  [ -f "$script" ] || { echo "FAIL  simple_http_$name.py (no such example)"; failed=$((failed + 1)); continue; }
  if (cd "$work" && timeout 120 "$root/$python" "$script" -u "127.0.0.1:$port") >"$work/$name.log" 2>&1; then
    echo "PASS  simple_http_$name.py"
  elif [ "$server" = toolkit ] && [ -n "${expected_failure[$name]:-}" ]; then
    echo "FAIL  simple_http_$name.py (expected: ${expected_failure[$name]})"
  else
    echo "FAIL  simple_http_$name.py"
    sed 's/^/      /' "$work/$name.log" | tail -15
    failed=$((failed + 1))
  fi
done
exit "$failed"
