#!/usr/bin/env bash
# Entry point of the trtllm-dflash images (installed as /usr/local/bin/dflash-entrypoint).
set -euo pipefail

usage() {
  cat <<'USAGE'
dflash-entrypoint ENGINE_DIR [dflash-serve options]
    Serve the engine on this node: write the Triton repository and the launch scripts
    (dflash-serve --print-launch $DFLASH_LAUNCH_DIR), then run launch_single_node.sh.
    Ports come from DFLASH_HTTP_PORT, DFLASH_GRPC_PORT, DFLASH_METRICS_PORT; DFLASH_DECODING is
    dflash (default) or plain (the target alone: the benchmark baseline).
    DRY_RUN=1 prints the serving commands instead of running them.
dflash-entrypoint healthcheck
    Exit 0 when Triton answers /v2/health/ready on DFLASH_HTTP_PORT.
dflash-entrypoint COMMAND [ARGS...]
    Run anything else: dflash-build, dflash-bench, bash, ...
USAGE
}

repo=${DFLASH_REPO:-/workspace/triton_repo}
launch=${DFLASH_LAUNCH_DIR:-/workspace/launch}
http=${DFLASH_HTTP_PORT:-8000}
grpc=${DFLASH_GRPC_PORT:-8001}
metrics=${DFLASH_METRICS_PORT:-8002}
decoding=${DFLASH_DECODING:-dflash}

case "${1:-}" in
  "" | -h | --help)
    usage
    exit 0
    ;;
  healthcheck)
    exec python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' \
      "http://127.0.0.1:${http}/v2/health/ready"
    ;;
esac
if [ ! -d "$1" ]; then
  exec "$@"
fi
if [ ! -f "$1/manifest.json" ]; then
  echo "dflash-entrypoint: error: $1 has no manifest.json (not an engine directory; make one with dflash-build)" >&2
  exit 2
fi
engine=$1
shift
dflash-serve "$engine" --model-repo "$repo" --print-launch "$launch" --decoding "$decoding" \
  --http-port "$http" --grpc-port "$grpc" --metrics-port "$metrics" "$@"
exec bash "$launch/launch_single_node.sh"
