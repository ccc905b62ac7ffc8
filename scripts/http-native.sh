#!/usr/bin/env bash
# Builds the native HTTP front end (handlers/protocol/httpnative/native/httpnative.cpp -> the
# `_httpnative` module beside it, for .venv's Python; served with TOOLKIT_HTTP_FRONTEND=native)
# when its source is newer than the module.
# Missing build dependencies (g++, pkg-config, libevent-dev, the Python headers) are installed
# with apt-get when running as root on Debian/Ubuntu, as scripts/ci-docker.sh installs its own.
#
#   scripts/http-native.sh            best effort: without them, a warning (uvicorn serves;
#                                     TOOLKIT_HTTP_FRONTEND=native is refused), exit 0
#   scripts/http-native.sh --require  exit 1 when it cannot build (CI)
#
# TOOLKIT_HTTP_NATIVE=0 skips it (best effort only).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
require=
[ "${1:-}" = "--require" ] && require=1
py=.venv/bin/python
log() { echo "==> [http-native] $*"; }
give_up() {
  if [ -n "$require" ]; then
    log "cannot build: $*" >&2
    exit 1
  fi
  log "not built ($*): HTTP is served by uvicorn only (TOOLKIT_HTTP_FRONTEND=native is refused); build it with scripts/http-native.sh"
  exit 0
}
if [ -z "$require" ] && [ "${TOOLKIT_HTTP_NATIVE:-1}" = "0" ]; then
  exit 0
fi
source=handlers/protocol/httpnative/native/httpnative.cpp
module=handlers/protocol/httpnative/$("$py" -c 'import sysconfig; print("_httpnative" + sysconfig.get_config_var("EXT_SUFFIX"))')
if [ -f "$module" ] && [ "$module" -nt "$source" ]; then
  exit 0
fi
missing=()
command -v g++ >/dev/null || missing+=(g++)
command -v pkg-config >/dev/null || missing+=(pkg-config)
pkg-config --exists libevent libevent_pthreads 2>/dev/null || missing+=(libevent-dev)
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
"$py" handlers/protocol/httpnative/native/build.py >/dev/null || give_up "the compiler failed (above)"
"$py" -c 'from handlers.protocol.httpnative import server' || give_up "the built module does not import"
log "built $module"
