#!/usr/bin/env bash
# Three `strata serve` nodes in network namespaces joined by a bridge, with a cluster key and
# no --peers, find each other by multicast discovery, place the model over all three and answer
# greedy completions exactly as one node alone; a fourth node with another key is refused and
# stays out; a fifth without a model file finds them too, takes their model and fetches the
# weights of the layers placed on it. What crosses a node's link (tcpdump) is TLS: no model
# name or hash, no method names, no HTTP/2 in the clear. Everything runs in namespaces this test creates (the bridge too): no traffic
# reaches any other address. Needs root; prints SKIP and exits 0 only when network namespaces
# cannot be created at all.
#
# usage: netns_test.sh STRATA MODEL.gguf
set -uo pipefail

STRATA=$1
MODEL=$2
KEY="netns-test-key-$$"
PREFIX="strata$$"  # unique per run: namespaces of concurrent runs never meet
SUBNET=10.77.0
WORK=$(mktemp -d)
NAMESPACES=()
PIDS=()
FAILED=0

pass() { echo "PASS $*"; }
fail() {
  echo "FAIL $*"
  FAILED=1
}

cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
  for _ in $(seq 50); do
    local running=0
    for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && running=1; done
    [ $running = 0 ] && break
    sleep 0.1
  done
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null; done
  # Deleting a namespace deletes its links, and with a veth end its peer in the other namespace.
  for ns in "${NAMESPACES[@]}"; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns delete "$ns" 2>/dev/null
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

for tool in ip tc curl python3 tcpdump; do
  command -v $tool >/dev/null || { echo "FAIL $tool is missing (scripts/install-deps.sh installs it)"; exit 1; }
done

add_namespace() {
  ip netns add "$1" || return 1
  NAMESPACES+=("$1")
  ip -n "$1" link set lo up
}

HUB="$PREFIX-hub"
if ! error=$(ip netns add "$HUB" 2>&1); then
  case "$error" in
    *"not permitted"* | *"Permission denied"*)
      echo "SKIP network namespaces cannot be created here (needs root with CAP_SYS_ADMIN): $error"
      exit 0 ;;
  esac
  echo "FAIL cannot create a network namespace: $error"
  exit 1
fi
NAMESPACES+=("$HUB")
set -e
ip -n "$HUB" link add br0 type bridge
# Without an IGMP querier on the bridge, snooping could stop forwarding the group.
ip -n "$HUB" link set br0 type bridge mcast_snooping 0
ip -n "$HUB" link set br0 up

# Namespace $PREFIX-nI with eth0 = $SUBNET.I on the bridge, shaped like a gigabit link.
add_lan_node_namespace() {
  local i=$1 ns="$PREFIX-n$1"
  add_namespace "$ns"
  ip -n "$HUB" link add "v$i" type veth peer name eth0 netns "$ns"
  ip -n "$HUB" link set "v$i" master br0 up
  ip -n "$ns" addr add "$SUBNET.$i/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate 1gbit burst 128kb latency 50ms
}
set +e

# start_node NAMESPACE NODE_ID ARGS...: strata serve on port 8080 there, log in $WORK/NODE_ID.log
start_node() {
  start_node_without_model "$@" -m "$MODEL"
}

# The same without a model file: the node takes the cluster's.
start_node_without_model() {
  local ns=$1 id=$2
  shift 2
  ip netns exec "$ns" "$STRATA" serve --node-id "$id" --port 8080 -t 1 --startup-wait 20 "$@" \
    >"$WORK/$id.log" 2>&1 &
  PIDS+=($!)
}

# http NAMESPACE PATH [JSON_BODY]: prints the body, then the status on its own line
http() {
  local args=(-s -m 30 -w '\n%{http_code}' "http://127.0.0.1:8080$2")
  [ $# -ge 3 ] && args+=(-H 'Content-Type: application/json' -d "$3")
  ip netns exec "$1" curl "${args[@]}"
}

status_of() { http "$@" | tail -n 1; }
body_of() { http "$@" | sed '$d'; }

wait_until() {  # wait_until SECONDS COMMAND...
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    [ $SECONDS -ge $deadline ] && return 1
    sleep 0.2
  done
}

healthy() { [ "$(status_of "$1" /health)" = 200 ]; }

# cluster_has NAMESPACE NODES STAGES: its /cluster shows NODES live members and STAGES stages, serving
cluster_has() {
  body_of "$1" /cluster | python3 -c '
import json, sys
c = json.load(sys.stdin)
live = [n for n in c["nodes"] if n["self"] or n.get("alive")]
sys.exit(0 if c["serving"] and len(live) == int(sys.argv[1]) and len(c["placement"]["stages"]) == int(sys.argv[2]) else 1)
' "$2" "$3" 2>/dev/null
}

REQUEST='{"prompt":"Once upon a time","max_tokens":24,"temperature":0}'
completion_text() {
  body_of "$1" /v1/completions "$REQUEST" | python3 -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["text"])'
}

show_logs() {
  for log in "$WORK"/*.log; do
    echo "---- $(basename "$log")"
    tail -n 40 "$log"
  done
}

# The reference: one node alone, in a namespace of its own with nothing but loopback.
add_namespace "$PREFIX-solo"
start_node "$PREFIX-solo" solo --host 127.0.0.1 --no-discovery

for i in 1 2 3; do
  add_lan_node_namespace $i || { echo "FAIL cannot build the test network"; exit 1; }
  start_node "$PREFIX-n$i" "ns$i" --host 0.0.0.0 --cluster-key "$KEY" --placement memory --test-link-delay-ms 2
done

if wait_until 40 healthy "$PREFIX-solo"; then
  EXPECTED=$(completion_text "$PREFIX-solo")
  [ -n "$EXPECTED" ] && pass "the node alone answers: $EXPECTED" || fail "the node alone gave no text"
else
  fail "the node alone did not become healthy"
fi

formed() { healthy "$PREFIX-n1" && healthy "$PREFIX-n2" && healthy "$PREFIX-n3" && cluster_has "$PREFIX-n1" 3 3; }
if wait_until 40 formed; then
  pass "three nodes without --peers found each other: 3 members, 3 stages, all healthy"
  for i in 1 2 3; do
    text=$(completion_text "$PREFIX-n$i")
    if [ -n "${EXPECTED:-}" ] && [ "$text" = "$EXPECTED" ]; then
      pass "node ns$i answers as the node alone"
    else
      fail "node ns$i answers '$text', the node alone '${EXPECTED:-}'"
    fi
  done
else
  fail "the three nodes did not form a cluster of 3 stages"
  body_of "$PREFIX-n1" /cluster
fi

# The links carry only TLS: a capture of ns2's TCP traffic while requests enter there (and
# go to the leader ns1, stage by stage) holds none of what the node messages would show in
# the clear: every Hello names the model and its hash, and h2c opens with a preface.
CAPTURE="$WORK/ns2.pcap"
ip netns exec "$PREFIX-n2" tcpdump -i eth0 -U -s 0 -w "$CAPTURE" tcp >"$WORK/tcpdump.log" 2>&1 &
TCPDUMP=$!
PIDS+=($TCPDUMP)
wait_until 10 grep -q "listening on" "$WORK/tcpdump.log"
completion_text "$PREFIX-n2" >/dev/null
completion_text "$PREFIX-n2" >/dev/null
sleep 1
kill -INT $TCPDUMP
wait $TCPDUMP 2>/dev/null
MODEL_HASH=$(body_of "$PREFIX-n1" /cluster | python3 -c 'import json, sys; print(json.load(sys.stdin)["model"]["hash"])')
if python3 - "$CAPTURE" "$MODEL_HASH" <<'PY'
import sys
data = open(sys.argv[1], "rb").read()
found = [name for name, marker in [("the model name", b"aidreams260K"), ("the model hash", sys.argv[2][:32].encode()),
                                   ("a method name", b"strata.rpc.Node"), ("an HTTP/2 preface", b"PRI * HTTP/2.0")]
         if marker in data]
records = data.count(b"\x17\x03\x03")
print(f"{len(data)} bytes captured, {records} TLS application records" + (", in the clear: " + ", ".join(found) if found else ""))
sys.exit(1 if found or records < 10 else 0)
PY
then
  pass "a capture of ns2's link holds TLS records only, nothing of the node messages in the clear"
else
  fail "ns2's link carries node messages in the clear (or too little was captured)"
fi

# A node with another key on the same bridge.
add_lan_node_namespace 4 || { echo "FAIL cannot build the test network"; exit 1; }
start_node "$PREFIX-n4" ns4 --host 0.0.0.0 --cluster-key "wrong-$KEY" --placement memory
refusal_logged() { grep -q "discovery refused an announcement with a wrong MAC.* from $SUBNET.4" "$WORK"/ns[123].log; }
if wait_until 20 refusal_logged; then
  pass "the keyed cluster logs a refusal: $(grep -h "from $SUBNET.4" "$WORK"/ns[123].log | head -n 1)"
else
  fail "no refusal of the node with another key was logged"
fi
sleep 2  # a few more announcements and gossip rounds for it to sneak in
if body_of "$PREFIX-n1" /cluster | python3 -c '
import json, sys
sys.exit(0 if all(n["id"] != "ns4" for n in json.load(sys.stdin)["nodes"]) else 1)'; then
  pass "the node with another key is not a member"
else
  fail "the node with another key is a member"
fi
cluster_has "$PREFIX-n1" 3 3 && pass "the keyed cluster still has 3 members and 3 stages" ||
  fail "the keyed cluster changed"

# A node without a model file and without --peers finds the cluster by discovery, takes its
# model and fetches the weights of its layers.
add_lan_node_namespace 5 || { echo "FAIL cannot build the test network"; exit 1; }
start_node_without_model "$PREFIX-n5" ns5 --host 0.0.0.0 --cluster-key "$KEY" --placement memory \
  --test-link-delay-ms 2 --cache-dir "$WORK/cache-ns5"
joined() { healthy "$PREFIX-n5" && cluster_has "$PREFIX-n1" 4 4; }
if wait_until 40 joined; then
  pass "a node without a model file joined by discovery: 4 members, 4 stages"
  text=$(completion_text "$PREFIX-n5")
  [ -n "${EXPECTED:-}" ] && [ "$text" = "$EXPECTED" ] && pass "node ns5 answers as the node alone" ||
    fail "node ns5 answers '$text', the node alone '${EXPECTED:-}'"
  grep -q "fetched .* of weights" "$WORK/ns5.log" && pass "node ns5 fetched its layers' weights" ||
    fail "node ns5 did not say it fetched weights"
else
  fail "the node without a model file did not join"
fi

if [ $FAILED != 0 ]; then
  show_logs
  exit 1
fi
echo "PASS netns discovery test"
