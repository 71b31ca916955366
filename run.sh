#!/usr/bin/env bash
# Set-up and start: installs what is missing, builds, and serves the OpenAI-compatible API.
# With arguments they go to `strata serve` on one node (e.g. -m model.gguf). Without any it
# starts a demo cluster of three nodes on this machine (loopback only, no discovery) that
# splits a generated random-weight model's layers, prints where its dashboard and API are, and
# stops all three on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")"
scripts/install-deps.sh
scripts/build.sh
if [ $# -gt 0 ]; then
  exec build/strata serve "$@"
fi

cache="${STRATA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/strata}"
model="$cache/demo-random-weights-Q8_0.gguf"
if [ ! -f "$model" ]; then
  mkdir -p "$cache"
  build/strata gguf synth --shape demo --type Q8_0 --seed 1 -o "$model"
fi
logs="$(mktemp -d "${TMPDIR:-/tmp}/strata-demo.XXXXXX")"
ports=(8080 8090 8100)
pids=()
stop() {
  trap - INT TERM
  echo
  echo "stopping the demo cluster"
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait "${pids[@]}" 2>/dev/null || true
  exit 0
}
trap stop INT TERM
for i in 0 1 2; do
  peers=()
  [ "$i" -gt 0 ] && peers=(--peers "127.0.0.1:$((ports[0] + 1))")
  build/strata serve -m "$model" --host 127.0.0.1 --port "${ports[$i]}" --node-id "demo-$((i + 1))" \
    --no-discovery --placement memory --parallel 4 --threads 1 "${peers[@]}" >"$logs/node-$((i + 1)).log" 2>&1 &
  pids+=($!)
done
for port in "${ports[@]}"; do
  until curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1; do
    for pid in "${pids[@]}"; do
      kill -0 "$pid" 2>/dev/null || { echo "a node stopped; its log is in $logs" >&2; tail -5 "$logs"/*.log >&2; stop; }
    done
    sleep 0.3
  done
done
cat <<TEXT

Strata demo cluster: three nodes on this machine split the layers of a generated model with
RANDOM WEIGHTS (its answers are noise; run ./run.sh -m MODEL.gguf for a real model).

  dashboard   http://127.0.0.1:8080/   (every node has one: :8090, :8100)
  API         http://127.0.0.1:8080/v1 (OpenAI-compatible, on every node)
  metrics     http://127.0.0.1:8080/metrics
  terminal    build/strata cluster --port 8080 --watch
  logs        $logs

Try:
  curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 32}'

Ctrl-C stops all three.
TEXT
wait "${pids[@]}"
