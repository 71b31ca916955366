#!/usr/bin/env bash
# Set-up and start: installs what is missing, builds, and runs Strata.
# Arguments go to `strata run`; with no -m it uses a small random-weight model it generates.
set -euo pipefail
cd "$(dirname "$0")"
scripts/install-deps.sh
scripts/build.sh
if [ $# -eq 0 ]; then set -- -p "Once upon a time" -n 48; fi
exec build/strata run "$@"
