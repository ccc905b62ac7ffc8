#!/usr/bin/env bash
# The native gRPC front end: scripts/native-frontend.sh grpc [--require].
exec "$(dirname "${BASH_SOURCE[0]}")/native-frontend.sh" grpc "$@"
