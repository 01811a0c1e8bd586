#!/usr/bin/env bash
# Set up the environment if needed (see scripts/env.sh) and run the main job.
# Extra arguments are config overrides, e.g. `bash scripts/quickstart.sh --seed 1` or `--env.id maniskill/PickCube-v1`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec vla-rl quickstart "$@"
