#!/usr/bin/env bash
# The native HTTP front end: scripts/native-frontend.sh http [--require].
exec "$(dirname "${BASH_SOURCE[0]}")/native-frontend.sh" http "$@"
