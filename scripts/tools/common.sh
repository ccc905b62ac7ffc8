# shellcheck shell=bash
# Shared by scripts/tools/*: the reference tools the tests and benchmarks compare against, each
# installed once, pinned, into its own virtual environment under $TOOLKIT_TOOLS_CACHE
# (default ~/.cache/toolkit-tools). Re-running is cheap: a marker file records what is installed.

TOOLKIT_TOOLS_CACHE=${TOOLKIT_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/toolkit-tools}
export TOOLKIT_TOOLS_CACHE

tools_say() { echo "[toolkit-tools] $*" >&2; }

# run_as_root CMD...: as root directly, else through sudo.
run_as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    tools_say "root is needed for: $*"; return 1
  fi
}

# debian_packages PKG...: install Debian packages that are missing (apt-get update only if needed).
debian_packages() {
  local missing=() pkg
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  tools_say "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  run_as_root apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 ||
    { run_as_root apt-get update -q >&2 && run_as_root apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; }
}

# pinned_venv DIR REQUIREMENT...: DIR holds exactly these pinned requirements (installed once,
# under a lock, so parallel test workers wait for one install instead of racing).
pinned_venv() {
  local dir=$1; shift
  local want="$*" marker="$dir/.toolkit-tools"
  [ -x "$dir/bin/python" ] && [ "$(cat "$marker" 2>/dev/null)" = "$want" ] && return 0
  mkdir -p "$(dirname "$dir")"
  (
    flock 9
    if ! { [ -x "$dir/bin/python" ] && [ "$(cat "$marker" 2>/dev/null)" = "$want" ]; }; then
      local started=$SECONDS
      tools_say "installing $want into $dir"
      rm -rf "$dir"
      "${TOOLKIT_TOOLS_PYTHON:-python3}" -m venv "$dir" >&2
      "$dir/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 | grep -v "^WARNING: Location" >&2 || true
      [ "${PIPESTATUS[0]}" = 0 ] || { tools_say "pip install $want failed"; exit 1; }
      echo "$want" > "$marker"
      tools_say "installed in $((SECONDS - started)) s"
    fi
  ) 9>"$dir.lock"
}

# venv_package DIR REQUIREMENT: one more pinned requirement in the venv DIR (pinned_venv made it),
# installed or replaced in place when it changes (e.g. the ONNX Runtime version), under DIR's lock.
venv_package() {
  local dir=$1 want=$2 marker="$1/.toolkit-tools-package"
  [ "$(cat "$marker" 2>/dev/null)" = "$want" ] && return 0
  (
    flock 9
    if [ "$(cat "$marker" 2>/dev/null)" != "$want" ]; then
      tools_say "installing $want into $dir"
      "$dir/bin/python" -m pip install -q --disable-pip-version-check "$want" 2>&1 | grep -v "^WARNING: Location" >&2 || true
      [ "${PIPESTATUS[0]}" = 0 ] || { tools_say "pip install $want failed"; exit 1; }
      echo "$want" > "$marker"
    fi
  ) 9>"$dir.lock"
}

# shared_library SONAME: does the dynamic linker know this library?
shared_library() {
  [[ "$(PATH="$PATH:/sbin:/usr/sbin" ldconfig -p 2>/dev/null)" == *" $1 ("* ]]
}
