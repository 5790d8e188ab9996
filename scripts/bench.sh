#!/usr/bin/env bash
# Sets up, builds and runs `lossfuse bench` (the main job). Extra arguments go to `lossfuse bench`.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target lossfuse_cli
exec build/release/lossfuse bench "$@"
