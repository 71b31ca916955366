#!/usr/bin/env bash
# Starts `strata serve` on the shared dreams model and drives it with the official npm clients
# (openai, @anthropic-ai/sdk, the Vercel AI SDK, ollama) and with curl. Usage: run_e2e.sh STRATA_BINARY SHARED_DIR
set -euo pipefail
strata=$1
model=$2/models/aidreams260K.gguf
here=$(cd "$(dirname "$0")" && pwd)
key=e2e-test-key
log=$(mktemp)

"$strata" serve -m "$model" --host 127.0.0.1 --port 0 --api-key "$key" --parallel 4 2>"$log" &
server=$!
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true; rm -f "$log"' EXIT

port=""
for _ in $(seq 1 600); do
  port=$(sed -n 's|.*on http://127.0.0.1:\([0-9]*\).*|\1|p' "$log" | head -1)
  [ -n "$port" ] && break
  kill -0 $server 2>/dev/null || { cat "$log"; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { echo "server did not start"; cat "$log"; exit 1; }
base=http://127.0.0.1:$port

# curl, as a user would try it first: /health answers 503 while the node places and loads
# the model, then 200.
for _ in $(seq 1 600); do
  curl -sf "$base/health" >/dev/null && break
  sleep 0.1
done
curl -sf "$base/health" >/dev/null
body=$(curl -sf "$base/v1/completions" -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
  -d '{"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}')
echo "$body" | grep -q '"object":"text_completion"' || { echo "curl completion: $body"; exit 1; }
status=$(curl -s -o /dev/null -w '%{http_code}' "$base/v1/models")
[ "$status" = 401 ] || { echo "no key gave $status, expected 401"; exit 1; }
echo "ok   curl: health, completion, 401 without a key"

node "$here/openai_client.mjs" "$base/v1" "$key" aidreams260K
node "$here/anthropic_client.mjs" "$base" "$key" aidreams260K
node "$here/structured_clients.mjs" "$base" "$key" aidreams260K

# SIGTERM stops the server cleanly.
kill -TERM $server
wait $server
echo "ok   server exited cleanly on SIGTERM"
