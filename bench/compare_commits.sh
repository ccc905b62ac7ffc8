#!/usr/bin/env bash
# Before/after of a runtime change: `toolkit serve` at two commits, the same repository, real
# perf_analyzer, runs alternating between the two (3 by default), at concurrency 1 and 16.
#
#   bench/compare_commits.sh REV_BEFORE REV_AFTER REPO MODEL [-- extra perf_analyzer options]
#   e.g. bench/compare_commits.sh 8c80db5 HEAD /tmp/models tiny
#
# Each commit is checked out in a temporary git worktree and run with this repository's .venv
# (python -m puts the worktree's toolkit/ and handlers/ first on the path). Prints one line per
# run; take medians.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
before=$1; after=$2; repo=$(realpath "$3"); model=$4; shift 4
[ "${1:-}" = "--" ] && shift
runs=${RUNS:-3}
py="$root/.venv/bin/python"
pa="${TOOLKIT_PERF_ANALYZER:-$root/scripts/tools/perf_analyzer}"
work=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$work/before" 2>/dev/null; git -C "$root" worktree remove --force "$work/after" 2>/dev/null; rm -rf "$work"' EXIT
git -C "$root" worktree add -q --detach "$work/before" "$before"
git -C "$root" worktree add -q --detach "$work/after" "$after"
port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for run in $(seq "$runs"); do
  for side in before after; do
    (cd "$work/$side" && exec "$py" -m toolkit.cli serve "$repo" --port "$port" --log-level warning >"$work/$side.log" 2>&1) &
    pid=$!
    for _ in $(seq 300); do curl -sf "127.0.0.1:$port/v2/health/ready" >/dev/null && break; sleep 0.1; done
    for c in 1 16; do
      out=$("$pa" -m "$model" -u "127.0.0.1:$port" -b 2 --concurrency-range "$c:$c" --percentile=95 \
        --measurement-interval 3000 --stability-percentage 1000 --max-trials 3 "$@" 2>&1 || true)
      echo "run=$run side=$side rev=$( [ $side = before ] && echo "$before" || echo "$after") c=$c" \
        "infer/s=$(grep -oP 'Throughput: \K[\d.]+' <<<"$out" | tail -1)" \
        "p95_us=$(grep -oP 'p95 latency: \K\d+' <<<"$out" | tail -1)"
    done
    kill "$pid"; wait "$pid" 2>/dev/null || true
  done
done
