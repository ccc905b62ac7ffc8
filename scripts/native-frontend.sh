#!/usr/bin/env bash
# Builds a native front end for .venv's Python when one of the files its build reads is newer
# than its module (handlers/protocol/native/build.py NAME):
#
#   grpc  grpc++ (handlers/protocol/grpc/native/grpcnative.cpp -> handlers/protocol/grpc/_grpcnative*.so);
#         without it, `toolkit serve` serves gRPC with grpcio's server
#   http  libevent's evhttp (handlers/protocol/httpnative/native/httpnative.cpp ->
#         handlers/protocol/httpnative/_httpnative*.so); without it, HTTP is served by uvicorn
#
# Missing build dependencies (g++, pkg-config, the front end's library, the Python headers) are
# installed with apt-get when running as root on Debian/Ubuntu, as scripts/ci-docker.sh installs
# its own.
#
#   scripts/native-frontend.sh NAME            best effort: without them, a warning, exit 0
#   scripts/native-frontend.sh NAME --require  exit 1 when it cannot build (CI)
#
# TOOLKIT_GRPC_NATIVE=0 / TOOLKIT_HTTP_NATIVE=0 skips it (best effort only).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
name=${1:-}
require=
[ "${2:-}" = "--require" ] && require=1
case "$name" in
  grpc)
    skip=${TOOLKIT_GRPC_NATIVE:-1}; libraries=(grpc++); debian=libgrpc++-dev
    check=handlers.protocol.grpc.nativeserver
    without="gRPC is served by grpcio's server" ;;
  http)
    skip=${TOOLKIT_HTTP_NATIVE:-1}; libraries=(libevent libevent_pthreads); debian=libevent-dev
    check=handlers.protocol.httpnative.server
    without="HTTP is served by uvicorn only (TOOLKIT_HTTP_FRONTEND=native is refused)" ;;
  *)
    echo "usage: scripts/native-frontend.sh grpc|http [--require]" >&2
    exit 2 ;;
esac
py=.venv/bin/python
builder=handlers/protocol/native/build.py
log() { echo "==> [$name-native] $*"; }
give_up() {
  if [ -n "$require" ]; then
    log "cannot build: $*" >&2
    exit 1
  fi
  log "not built ($*): $without; build it with scripts/native-frontend.sh $name"
  exit 0
}
if [ -z "$require" ] && [ "$skip" = "0" ]; then
  exit 0
fi
module=$("$py" "$builder" "$name" --module-path)
if [ -f "$module" ]; then
  stale=
  for source in $("$py" "$builder" "$name" --sources); do
    [ "$source" -nt "$module" ] && stale=1
  done
  [ -z "$stale" ] && exit 0
fi
missing=()
command -v g++ >/dev/null || missing+=(g++)
command -v pkg-config >/dev/null || missing+=(pkg-config)
pkg-config --exists "${libraries[@]}" 2>/dev/null || missing+=("$debian")
include=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
[ -f "$include/Python.h" ] || missing+=("python3-dev")
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    give_up "missing ${missing[*]} (install them, e.g. apt-get install ${missing[*]})"
  fi
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; } ||
    give_up "apt-get install ${missing[*]} failed"
fi
"$py" "$builder" "$name" >/dev/null || give_up "the compiler failed (above)"
"$py" -c "import $check" || give_up "the built module does not import"
log "built $module"
