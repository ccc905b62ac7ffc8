#!/usr/bin/env bash
# Builds the native gRPC front end (handlers/protocol/grpc/native/grpcnative.cpp -> the
# `_grpcnative` module beside it, for .venv's Python) when its source is newer than the module.
# Missing build dependencies (g++, pkg-config, libgrpc++-dev, the Python headers) are installed
# with apt-get when running as root on Debian/Ubuntu, as scripts/ci-docker.sh installs its own.
#
#   scripts/grpc-native.sh            best effort: without them, a warning (toolkit serve then
#                                     serves gRPC with grpcio's server), exit 0
#   scripts/grpc-native.sh --require  exit 1 when it cannot build (CI)
#
# TOOLKIT_GRPC_NATIVE=0 skips it (best effort only).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
require=
[ "${1:-}" = "--require" ] && require=1
py=.venv/bin/python
log() { echo "==> [grpc-native] $*"; }
give_up() {
  if [ -n "$require" ]; then
    log "cannot build: $*" >&2
    exit 1
  fi
  log "not built ($*): gRPC is served by grpcio's server; build it with scripts/grpc-native.sh"
  exit 0
}
if [ -z "$require" ] && [ "${TOOLKIT_GRPC_NATIVE:-1}" = "0" ]; then
  exit 0
fi
source=handlers/protocol/grpc/native/grpcnative.cpp
module=handlers/protocol/grpc/$("$py" -c 'import sysconfig; print("_grpcnative" + sysconfig.get_config_var("EXT_SUFFIX"))')
if [ -f "$module" ] && [ "$module" -nt "$source" ]; then
  exit 0
fi
missing=()
command -v g++ >/dev/null || missing+=(g++)
command -v pkg-config >/dev/null || missing+=(pkg-config)
pkg-config --exists grpc++ 2>/dev/null || missing+=(libgrpc++-dev)
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
"$py" handlers/protocol/grpc/native/build.py >/dev/null || give_up "the compiler failed (above)"
"$py" -c 'from handlers.protocol.grpc import nativeserver' || give_up "the built module does not import"
log "built $module"
