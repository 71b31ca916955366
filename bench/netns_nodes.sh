# Sourced by the benchmarks that run `strata serve` nodes in network namespaces: the set-up
# they share. The caller sets WORK (a scratch directory with the nodes' logs), and adds to
# NAMESPACES and PIDS what it creates and starts.
NAMESPACES=()
PIDS=()

# Stops the nodes (SIGTERM, up to 10 s each, then SIGKILL), deletes the namespaces and WORK.
cleanup_nodes() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${PIDS[@]}"; do timeout 10 tail --pid="$pid" -f /dev/null 2>/dev/null; done
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null; done
  for ns in "${NAMESPACES[@]}"; do ip netns delete "$ns" 2>/dev/null; done
  rm -rf "$WORK"
}

# wait_healthy NAMESPACE: until the node on port 8080 there answers /health with 200 (5 min);
# else prints the nodes' logs and exits.
wait_healthy() {
  local status
  for _ in $(seq 600); do
    status=$(ip netns exec "$1" curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8080/health)
    [ "$status" = 200 ] && return 0
    sleep 0.5
  done
  echo "the node in $1 did not become healthy"
  tail -n 30 "$WORK"/*.log
  exit 1
}
