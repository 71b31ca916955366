#!/usr/bin/env bash
# Starts `strata serve` on the shared dreams model and drives it with the official npm clients
# (openai, @anthropic-ai/sdk, the Vercel AI SDK, ollama) and with curl. Usage: run_e2e.sh STRATA_BINARY SHARED_DIR
set -euo pipefail
strata=$1
model=$2/models/aidreams260K.gguf
here=$(cd "$(dirname "$0")" && pwd)
key=e2e-test-key
log=$(mktemp)

embedding_model=$(mktemp --suffix=.gguf)
embedding_log=$(mktemp)
servers=""
trap 'kill $servers 2>/dev/null || true; wait $servers 2>/dev/null || true; rm -f "$log" "$embedding_log" "$embedding_model"' EXIT

# Starts `strata serve -m MODEL` with the key, its stderr in LOG; sets $server and $base.
serve() {
  "$strata" serve -m "$1" --host 127.0.0.1 --port 0 --no-discovery --api-key "$key" --parallel 4 2>"$2" &
  server=$!
  servers="$servers $server"
  local port=""
  for _ in $(seq 1 600); do
    port=$(sed -n 's|.*on http://127.0.0.1:\([0-9]*\).*|\1|p' "$2" | head -1)
    [ -n "$port" ] && break
    kill -0 $server 2>/dev/null || { cat "$2"; exit 1; }
    sleep 0.1
  done
  [ -n "$port" ] || { echo "server did not start"; cat "$2"; exit 1; }
  base=http://127.0.0.1:$port
}

serve "$model" "$log"

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
dreams_server=$server

# An embedding model (random weights, the shape of a small Qwen3 embedding model) on a server of its own.
"$strata" gguf synth --shape qwen3-embedding-tiny --type Q8_0 -o "$embedding_model" >/dev/null 2>&1
serve "$embedding_model" "$embedding_log"
for _ in $(seq 1 600); do
  curl -sf "$base/health" >/dev/null && break
  sleep 0.1
done
node "$here/embedding_clients.mjs" "$base" "$key" "$(basename "$embedding_model" .gguf)"
kill -TERM $server
wait $server
server=$dreams_server

# SIGTERM stops the server cleanly.
kill -TERM $server
wait $server
echo "ok   server exited cleanly on SIGTERM"
