#!/usr/bin/env bash
# Set-up and start: installs what is missing, builds, and serves the OpenAI-compatible API.
# Arguments go to `strata serve`; with no -m it serves a small random-weight demo model.
set -euo pipefail
cd "$(dirname "$0")"
scripts/install-deps.sh
scripts/build.sh
exec build/strata serve "$@"
