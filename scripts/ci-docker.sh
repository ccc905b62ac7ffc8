#!/usr/bin/env bash
# Container engine for `toolkit build` and its end-to-end tests (tests/test_build_e2e.py).
#
#   scripts/ci-docker.sh install   apt-get install docker.io debootstrap docker-registry buildah (root)
#   scripts/ci-docker.sh start     start a private dockerd (vfs, no iptables, no bridge) on
#                                  $TOOLKIT_DOCKER_DIR/docker.sock (default /tmp/toolkit-docker)
#   scripts/ci-docker.sh base      make the local Python base image $TOOLKIT_BASE_IMAGE with
#                                  debootstrap (Debian bookworm minbase + python3) + docker import
#   scripts/ci-docker.sh base-other  the same from Debian trixie: $TOOLKIT_OTHER_BASE_IMAGE, whose
#                                  Python (3.13) is not the host's (tests/test_build_e2e_abi3.py)
#   scripts/ci-docker.sh stop      stop the dockerd started by `start`
#   scripts/ci-docker.sh all       install + start + base + base-other (what .ci/run does)
#
# The engine is private: its socket is not /var/run/docker.sock and it never touches the host's
# network setup (--iptables=false --bridge=none), so containers run with --network host. Use it
# with DOCKER_HOST=unix://$TOOLKIT_DOCKER_DIR/docker.sock and /usr/bin/docker (BuildKit needs
# DOCKER_BUILDKIT=1). No registry is needed: the base image is built from Debian packages.
set -euo pipefail

dir=${TOOLKIT_DOCKER_DIR:-/tmp/toolkit-docker}
base_image=${TOOLKIT_BASE_IMAGE:-toolkit-ci/python:3.11-bookworm}
other_base_image=${TOOLKIT_OTHER_BASE_IMAGE:-toolkit-ci/python:3.13-trixie}
mirror=${TOOLKIT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
sock="$dir/docker.sock"
docker_cli=/usr/bin/docker
export DOCKER_HOST="unix://$sock"

log() { echo "==> [ci-docker] $*"; }

install() {
  local missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  [ -x "$docker_cli" ] || missing+=(docker.io)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  command -v docker-registry >/dev/null || missing+=(docker-registry)
  command -v buildah >/dev/null || missing+=(buildah)
  if [ ${#missing[@]} -eq 0 ]; then
    log "docker.io, debootstrap, docker-registry and buildah already installed"
    return
  fi
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # policy-rc.d: never let the package start a system dockerd (we start our own).
  local made_policy=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    made_policy=1
  fi
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if [ -n "$made_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi
}

engine_up() {
  [ -S "$sock" ] && "$docker_cli" info >/dev/null 2>&1
}

start() {
  if engine_up; then
    log "dockerd already answering on $sock"
    return
  fi
  mkdir -p "$dir/data" "$dir/exec"
  log "starting dockerd on $sock (log: $dir/dockerd.log)"
  # setsid: the daemon outlives this script (CI runs the tests next) but not the machine.
  setsid dockerd \
    --iptables=false --ip6tables=false --bridge=none \
    --storage-driver=vfs \
    --data-root "$dir/data" --exec-root "$dir/exec" \
    --pidfile "$dir/dockerd.pid" \
    -H "unix://$sock" >"$dir/dockerd.log" 2>&1 < /dev/null &
  for _ in $(seq 1 120); do
    if engine_up; then
      log "dockerd ready ($("$docker_cli" version --format '{{.Server.Version}}'))"
      return
    fi
    sleep 0.5
  done
  tail -30 "$dir/dockerd.log" >&2
  echo "dockerd did not answer on $sock within 60 s" >&2
  exit 1
}

stop() {
  if [ -f "$dir/dockerd.pid" ]; then
    local pid
    pid=$(cat "$dir/dockerd.pid")
    log "stopping dockerd (pid $pid)"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
    echo "dockerd (pid $pid) did not stop" >&2
    return 1
  fi
}

# base IMAGE SUITE: Debian SUITE minbase + python3, imported as IMAGE (once).
base() {
  local image=$1 suite=$2
  if "$docker_cli" image inspect "$image" >/dev/null 2>&1; then
    log "base image $image already present"
    return
  fi
  local root
  root=$(mktemp -d /tmp/toolkit-rootfs.XXXXXX)
  chmod 755 "$root"  # it becomes the image's /, which non-root users must be able to enter
  log "debootstrap $suite minbase + python3 into $root ($mirror)"
  debootstrap --variant=minbase --include=python3 "$suite" "$root" "$mirror" >"$dir/debootstrap.log" 2>&1 || {
    tail -30 "$dir/debootstrap.log" >&2
    exit 1
  }
  # Slim it down: no package caches, docs, man pages or locales are needed to run Python.
  rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
    "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* \
    "$root"/var/log/* "$root"/tmp/*
  log "docker import -> $image"
  tar -C "$root" --numeric-owner -c . | "$docker_cli" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    - "$image" >/dev/null
  rm -rf "$root"
  "$docker_cli" run --rm --network none "$image" python3 -c 'import sys; print("base image python", sys.version.split()[0])'
}

case "${1:-all}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  base) base "$base_image" bookworm ;;
  base-other) base "$other_base_image" trixie ;;
  all) install; start; base "$base_image" bookworm; base "$other_base_image" trixie ;;
  *) echo "usage: $0 [install|start|base|base-other|stop|all]" >&2; exit 2 ;;
esac
