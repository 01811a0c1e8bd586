#!/usr/bin/env bash
# Set up the environment if needed (see scripts/env.sh) and run the test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m slow` or `bash scripts/test.sh tests/sim`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$VLA_RL_ROOT"
if [ "$#" -eq 0 ]; then set -- -m "not slow" tests; fi
exec python -m pytest -q -ra "$@"
