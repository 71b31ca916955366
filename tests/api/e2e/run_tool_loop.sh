#!/usr/bin/env bash
# Starts scripted_tool_server and drives a tool loop through it with the official clients (openai,
# @anthropic-ai/sdk, the Vercel AI SDK, ollama).
# Usage: run_tool_loop.sh SCRIPTED_TOOL_SERVER SHARED_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp)
exec 3> >("$1" "$2" >"$out")  # the server lives until this script closes its input
for _ in $(seq 1 100); do
  base=$(sed -n 's|^listening on \(http://[0-9.:]*\)$|\1|p' "$out")
  [ -n "$base" ] && break
  sleep 0.1
done
rm -f "$out"
[ -n "$base" ] || { echo "scripted_tool_server did not start"; exit 1; }
node "$here/tool_loop.mjs" "$base/v1"
node "$here/agent_clients.mjs" "$base"
