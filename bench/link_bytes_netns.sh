#!/usr/bin/env bash
# Bytes on each node link per generated token: three `strata serve` nodes in network namespaces
# on a bridge, each link shaped to 1 Gbit/s (tbf), the model's layers split a:FIRST, b, c. A
# greedy completion of 1 token and one of 1 + TOKENS tokens, the same prompt; the difference
# over TOKENS is what one decode step costs on each link, twice over:
# - the Forward calls' message bytes, from each node's own link counters (/metrics), by peer;
# - every byte on each namespace's interface (TLS, TCP and the nodes' gossip included).
# Then decode speed on those links: one stream's tokens per second (the long completion's time
# less the short one's, over TOKENS), and the aggregate of 8 concurrent streams of 1 + TOKENS.
# DELAY_MS (default 0) adds that much before every node-to-node call (--test-link-delay-ms), as
# a LAN's latency would; netem is not available to add it on the wire. EXCHANGE_DELAY_US (default
# 0) likewise holds back every gather of a tensor-parallel group (--test-exchange-delay-us).
# SPECULATIVE (default: the server's) is passed as --speculative: `off` where builds whose
# greedy text differs are compared, since prompt lookup's drafts depend on the text.
# Needs root (network namespaces, tc).
#
# usage: [DELAY_MS=2] [EXCHANGE_DELAY_US=200] [SPECULATIVE=off] link_bytes_netns.sh STRATA MODEL.gguf STAGES [TOKENS]   e.g. STAGES=a:0-1,b:2-2,c:3-3
set -uo pipefail

STRATA=$1
MODEL=$2
STAGES=$3
TOKENS=${4:-64}
DELAY_MS=${DELAY_MS:-0}
EXCHANGE_DELAY_US=${EXCHANGE_DELAY_US:-0}
KEY="bench-key-$$"
PREFIX="slb$$"
SUBNET=10.79.0
WORK=$(mktemp -d)
. "$(dirname "$0")/netns_nodes.sh"
trap cleanup_nodes EXIT

set -e
HUB="$PREFIX-hub"
ip netns add "$HUB"
NAMESPACES+=("$HUB")
ip -n "$HUB" link add br0 type bridge
ip -n "$HUB" link set br0 up
i=0
for node in a b c; do
  i=$((i + 1))
  ns="$PREFIX-$node"
  ip netns add "$ns"
  NAMESPACES+=("$ns")
  ip -n "$ns" link set lo up
  ip -n "$HUB" link add "v$i" type veth peer name eth0 netns "$ns"
  ip -n "$HUB" link set "v$i" master br0 up
  ip -n "$ns" addr add "$SUBNET.$i/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate 1gbit burst 128kb latency 50ms
done
set +e

for node in a b c; do
  peers=()
  [ "$node" != a ] && peers=(--peers "$SUBNET.1:8081")
  ip netns exec "$PREFIX-$node" "$STRATA" serve -m "$MODEL" --node-id "$node" --port 8080 --host 0.0.0.0 \
    --cluster-key "$KEY" --no-discovery "${peers[@]}" --stages "$STAGES" -t 1 -c 512 --parallel 8 \
    --test-link-delay-ms "$DELAY_MS" --test-exchange-delay-us "$EXCHANGE_DELAY_US" \
    ${SPECULATIVE:+--speculative "$SPECULATIVE"} >"$WORK/$node.log" 2>&1 &
  PIDS+=($!)
done

wait_healthy "$PREFIX-a"

# Interface bytes (tx rx) of every node, then the leader's Forward counters by peer.
snapshot() {
  for node in a b c; do
    echo "if $node $(ip netns exec "$PREFIX-$node" cat /sys/class/net/eth0/statistics/tx_bytes)" \
      "$(ip netns exec "$PREFIX-$node" cat /sys/class/net/eth0/statistics/rx_bytes)"
  done
  for node in a b c; do
    ip netns exec "$PREFIX-$node" curl -s http://127.0.0.1:8080/metrics |
      sed -n "s/^strata_link_\(sent\|received\)_bytes_total{\(.*\)} \(.*\)\$/link $node:\1 \2 \3/p" | grep 'Forward'
  done
}

complete() {  # complete MAX_TOKENS: the completion's token count
  ip netns exec "$PREFIX-a" curl -s -m 120 http://127.0.0.1:8080/v1/completions -H 'Content-Type: application/json' \
    -d "{\"prompt\": \"The history of the city begins with\", \"max_tokens\": $1, \"temperature\": 0}" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["usage"]["completion_tokens"])'
}

now() { date +%s.%N; }
complete 4 >/dev/null  # warm: connections open
snapshot >"$WORK/s0"
t0=$(now)
short=$(complete 1)
t1=$(now)
snapshot >"$WORK/s1"
t2=$(now)
long=$(complete $((1 + TOKENS)))
t3=$(now)
snapshot >"$WORK/s2"
STREAMS=()
t4=$(now)
for stream in $(seq 8); do
  complete $((1 + TOKENS)) >"$WORK/stream$stream" &
  STREAMS+=($!)
done
wait "${STREAMS[@]}"
t5=$(now)
echo "$t0 $t1 $t2 $t3 $t4 $t5 $(cat "$WORK"/stream* | tr '\n' ' ')" >"$WORK/times"

python3 - "$WORK" "$short" "$long" <<'EOF'
import sys
work, short, long = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def read(name):
    out = {}
    for line in open(f"{work}/{name}"):
        parts = line.split()
        if parts[0] == "if":
            out[("if", parts[1], "tx")] = float(parts[2])
            out[("if", parts[1], "rx")] = float(parts[3])
        else:
            out[("link", parts[1], parts[2])] = float(parts[3])
    return out
s0, s1, s2 = read("s0"), read("s1"), read("s2")
steps = long - short
times = [float(x) for x in open(f"{work}/times").read().split()]
t0, t1, t2, t3, t4, t5, streams = *times[:6], times[6:]
print(f"one stream: {steps / ((t3 - t2) - (t1 - t0)):.1f} tokens/s; "
      f"8 streams: {sum(streams) / (t5 - t4):.1f} tokens/s aggregate ({sum(streams):.0f} tokens)")
print(f"decode steps measured: {steps} (completions of {short} and {long} tokens)")
for key in sorted(s2):
    one = s1.get(key, 0) - s0.get(key, 0)
    many = s2.get(key, 0) - s1.get(key, 0)
    if key[0] == "if":
        label = f"node {key[1]} interface {key[2]}"
    else:
        node, direction = key[1].split(":")
        label = f"node {node} Forward {direction} {key[2]}"
    print(f"{label:60s} {(many - one) / steps:10.0f} bytes per token")
EOF
