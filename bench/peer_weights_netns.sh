#!/usr/bin/env bash
# Weight transfer rate between two nodes over a link shaped to 1 Gbit/s: node a, in a network
# namespace of its own, has the model file; node b, in another, has none and fetches the
# weights of the layers placed on it. Prints b's fetch (bytes, seconds, rate) and the rate as
# a share of the link. Needs root (network namespaces, tc).
#
# usage: peer_weights_netns.sh STRATA MODEL.gguf STAGES   e.g. STAGES=a:0-0,b:1-21
set -uo pipefail

STRATA=$1
MODEL=$2
STAGES=$3
KEY="bench-key-$$"
PREFIX="swb$$"
WORK=$(mktemp -d)
. "$(dirname "$0")/netns_nodes.sh"
trap cleanup_nodes EXIT

set -e
ip netns add "$PREFIX-a"
NAMESPACES+=("$PREFIX-a")
ip netns add "$PREFIX-b"
NAMESPACES+=("$PREFIX-b")
ip -n "$PREFIX-a" link add eth0 type veth peer name eth0 netns "$PREFIX-b"
for side in a:1 b:2; do
  ns="$PREFIX-${side%%:*}"
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "10.78.0.${side##*:}/24" dev eth0
  ip -n "$ns" link set eth0 up
  # Both directions shaped like a gigabit link, as netns_test.sh does.
  ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate 1gbit burst 128kb latency 50ms
done
set +e

ip netns exec "$PREFIX-a" "$STRATA" serve -m "$MODEL" --node-id a --port 8080 --host 0.0.0.0 \
  --cluster-key "$KEY" --no-discovery --stages "$STAGES" -t 1 >"$WORK/a.log" 2>&1 &
PIDS+=($!)
ip netns exec "$PREFIX-b" "$STRATA" serve --node-id b --port 8080 --host 0.0.0.0 --cluster-key "$KEY" \
  --no-discovery --peers 10.78.0.1:8081 --stages "$STAGES" -t 1 --cache-dir "$WORK/cache" >"$WORK/b.log" 2>&1 &
PIDS+=($!)

wait_healthy "$PREFIX-b"
ip netns exec "$PREFIX-b" curl -s http://127.0.0.1:8080/cluster | python3 -c '
import json, sys
w = next(n["weights"] for n in json.load(sys.stdin)["nodes"] if n["self"])
size, rate = w["fetch_received_bytes"], w["bytes_per_second"]
print(f"fetched {size / 2**20:.1f} MiB in {size / rate:.2f} s: {rate / 1e6:.1f} MB/s, "
      f"{rate * 8 / 1e9 * 100:.0f}% of 1 Gbit/s")'
grep -h "fetched\|fetching" "$WORK/b.log"
