#!/usr/bin/env python3
"""Faults on a real network: three `strata serve` nodes, each in a network namespace of its own
on a bridge shaped to 1 Gbit/s, serve 8 concurrent seeded streams while the middle stage is
SIGKILLed (it is an entry too: only the streams that entered there end), the last stage is
SIGKILLed, the last stage's cable is cut (its veth set down, the process left running), the
middle stage is drained (SIGTERM), the leader is drained, and a fourth node joins. Every other
stream completes without an error event, and each whole text equals the fault-free run's; the
drains and the join hand the sequences' state over, computing none again. The longest pause
each fault caused is printed.

Everything runs in namespaces this test creates (the bridge too): no traffic reaches any other
address. Needs root; prints SKIP and exits 0 only when network namespaces cannot be created.

usage: netns_faults_test.py STRATA MODEL.gguf
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

from cluster_processes_test import settled, stop_all

STRATA, MODEL = sys.argv[1], sys.argv[2]
PREFIX = f"sf{os.getpid()}"  # unique per run: namespaces of concurrent runs never meet
HUB = f"{PREFIX}-hub"
SUBNET = "10.78.0"
KEY = f"netns-faults-{os.getpid()}"
API_PORT, NODE_PORT = 8080, 8081
FAILURES = []
NAMESPACES = []
PROCESSES = []

# Seeded sampling, so that a replay that drew different random numbers would show; long enough
# (with the test link delay) that every fault lands mid-stream.
STREAMS = [{"prompt": p, "max_tokens": 80, "temperature": t, "seed": s}
           for p, t, s in [("Once upon a time", 0.8, 1), ("The robot", 0.9, 7), ("In a dream I saw", 1.0, 99),
                           ("Colours", 0.7, 3), ("A city of glass", 0.7, 11), ("The moon", 0.8, 5),
                           ("Silence", 0.9, 8), ("My cat", 1.0, 42)]]


def check(condition, message):
    print(("PASS " if condition else "FAIL ") + message, flush=True)
    if not condition:
        FAILURES.append(message)
    return condition


def ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def namespace(name):
    ip("netns", "add", name)
    NAMESPACES.append(name)
    ip("-n", name, "link", "set", "lo", "up")


def build_network(count):
    """The bridge in the hub namespace and `count` node namespaces on it, 1 Gbit/s each."""
    ip("-n", HUB, "link", "add", "br0", "type", "bridge")
    ip("-n", HUB, "link", "set", "br0", "up")
    for i in range(1, count + 1):
        ns = f"{PREFIX}-n{i}"
        namespace(ns)
        ip("-n", HUB, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
        ip("-n", HUB, "link", "set", f"v{i}", "master", "br0", "up")
        ip("-n", ns, "addr", "add", f"{SUBNET}.{i}/24", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate",
                        "1gbit", "burst", "128kb", "latency", "50ms"], check=True)


def set_cable(i, up):
    ip("-n", HUB, "link", "set", f"v{i}", "up" if up else "down")


class Node:
    def __init__(self, i, seed=None, link_delay_ms=20):
        self.i, self.id, self.ns = i, f"n{i}", f"{PREFIX}-n{i}"
        self.log = f"/tmp/{PREFIX}-n{i}.log"
        args = ["ip", "netns", "exec", self.ns, STRATA, "serve", "-m", MODEL, "--node-id", self.id,
                "--host", "0.0.0.0", "--port", str(API_PORT), "--node-port", str(NODE_PORT), "-t", "1",
                "--parallel", "8", "--startup-wait", "30", "--cluster-key", KEY, "--no-discovery",
                "--placement", "memory", "--test-link-delay-ms", str(link_delay_ms)]
        if seed:
            args += ["--peers", f"{SUBNET}.{seed.i}:{NODE_PORT}"]
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
        PROCESSES.append(self.process)

    def curl(self, path, body=None, timeout=30):
        args = ["ip", "netns", "exec", self.ns, "curl", "-s", "-m", str(timeout), f"http://127.0.0.1:{API_PORT}{path}"]
        if body is not None:
            args += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
        result = subprocess.run(args, capture_output=True, text=True)
        try:
            return json.loads(result.stdout)
        except json.JSONDecodeError:
            return None

    def cluster(self):
        return self.curl("/cluster") or {}

    def stage_nodes(self):
        return [s["node"] for s in self.cluster().get("placement", {}).get("stages", [])]

    def text(self):
        with open(self.log, encoding="utf-8", errors="replace") as f:
            return f.read()

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def wait_for(condition, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


def start_cluster(link_delay_ms=20):
    first = Node(1, link_delay_ms=link_delay_ms)
    nodes = [first, Node(2, first, link_delay_ms), Node(3, first, link_delay_ms)]
    formed = wait_for(lambda: settled(first.cluster(), 3) and all((n.curl("/health") or {}).get("status") == "ok" for n in nodes), 40)
    if not check(formed, f"three nodes formed a 3-stage cluster ({first.stage_nodes()})"):
        for n in nodes:
            print(f"---- {n.id}\n{n.text()[-3000:]}")
    return nodes


class Stream:
    """One streamed completion through curl inside the entry node's namespace."""

    def __init__(self, entry, request):
        self.process = subprocess.Popen(
            ["ip", "netns", "exec", entry.ns, "curl", "-sN", "--max-time", "120",
             f"http://127.0.0.1:{API_PORT}/v1/completions", "-H", "Content-Type: application/json",
             "-d", json.dumps(request | {"stream": True})], stdout=subprocess.PIPE, text=True)
        self.lines = []
        self.reader = threading.Thread(target=lambda: [self.lines.append((time.time(), line))
                                                       for line in self.process.stdout])
        self.reader.start()

    def finish(self):
        self.process.wait(timeout=150)
        self.reader.join()
        self.events = [json.loads(line[6:]) for _, line in self.lines if line.startswith("data: {")]
        self.text = "".join(e["choices"][0]["text"] for e in self.events if "choices" in e)
        self.error = next((e["error"] for e in self.events if "error" in e), None)
        self.done = any(line.strip() == "data: [DONE]" for _, line in self.lines)
        return self

    def longest_pause_after(self, moment):
        times = [t for t, line in self.lines if line.startswith("data: {")]
        return max((b - a for a, b in zip(times, times[1:]) if b > moment), default=0.0)


def run_streams(entries, fault=None, fault_after=1.5):
    streams = [Stream(entries[i % len(entries)], r) for i, r in enumerate(STREAMS)]
    fault_at = None
    if fault:
        time.sleep(fault_after)
        fault_at = time.time()
        fault()
    for s in streams:
        s.finish()
    return streams, fault_at


def check_streams(label, streams, expected, fault_at, lost=()):
    """Checks every stream not in lost (indices into streams), naming each by its index."""
    for i, s in enumerate(streams):
        if i in lost:
            continue
        check(s.done and s.error is None, f"{label}: stream {i} completes without an error ({s.error})")
        check(s.text == expected[i], f"{label}: stream {i}'s whole text equals the fault-free run's")
    pause = max(s.longest_pause_after(fault_at) for i, s in enumerate(streams) if i not in lost)
    print(f"{label}: the longest pause of a stream after the fault was {pause:.2f} s", flush=True)


def by_id(nodes, node_id):
    return next(n for n in nodes if n.id == node_id)


def main():
    try:
        namespace(HUB)
    except subprocess.CalledProcessError as e:
        if "not permitted" in e.stderr or "Permission denied" in e.stderr:
            print(f"SKIP network namespaces cannot be created here (needs root): {e.stderr.strip()}")
            return 0
        raise
    build_network(4)

    nodes = start_cluster()
    stages = nodes[0].stage_nodes()
    streams, _ = run_streams(nodes)
    expected = [s.text for s in streams]
    check(all(s.done and s.error is None and s.text for s in streams),
          f"the fault-free run completes all 8 streams over stages {stages}")
    stop_all(nodes)

    for label, victim_stage, kill in [("the middle stage killed", 1, True), ("the last stage killed", 2, True),
                                      ("the last stage's cable cut", 2, False)]:
        nodes = start_cluster()
        stages = nodes[0].stage_nodes()
        if not check(len(stages) == 3, f"{label}: three stages ({stages})"):
            stop_all(nodes)
            continue
        victim = by_id(nodes, stages[victim_stage])
        survivors = [n for n in nodes if n is not victim]
        if kill:
            fault = lambda: victim.process.send_signal(signal.SIGKILL)  # noqa: E731
        else:
            fault = lambda: set_cable(victim.i, False)  # noqa: E731
        # The middle stage is also an entry: its own clients' streams end with it, and only those.
        entries = nodes if victim_stage == 1 and kill else survivors
        streams, fault_at = run_streams(entries, fault)
        lost = [i for i in range(len(streams)) if entries[i % len(entries)] is victim]
        for i in lost:
            check(not streams[i].done, f"{label}: stream {i}, which entered at the killed node, ends with it")
        check_streams(label, streams, expected, fault_at, lost)
        if not kill:
            set_cable(victim.i, True)
        stop_all(nodes)

    # A node that leaves on purpose (SIGTERM) hands its sequences' state over: nothing is
    # computed again, and it exits by itself once that is done. A leader that leaves goes on
    # scheduling until the next leader serves, then passes its requests on with their state.
    for label, leaves in [("the middle stage drained", lambda nodes: by_id(nodes, nodes[0].stage_nodes()[1])),
                          ("the leader drained", lambda nodes: by_id(nodes, nodes[0].cluster().get("leader")))]:
        nodes = start_cluster()
        leaving = leaves(nodes)
        staying = [n for n in nodes if n is not leaving]
        streams, fault_at = run_streams(staying, lambda: leaving.process.send_signal(signal.SIGTERM))
        check_streams(label, streams, expected, fault_at)
        switches = staying[0].cluster().get("placement_switches", {})
        check(switches.get("sequences_recomputed") == 0 and switches.get("sequences_handed_over", 0) > 0,
              f"{label}: every running sequence was handed over, none computed again ({switches})")
        try:
            leaving.process.wait(timeout=30)
            check("left after" in leaving.text(), f"{label}: the node exits once its state has moved")
        except subprocess.TimeoutExpired:
            check(False, f"{label}: the node exits by itself")
        stop_all(nodes)

    # A joining node must start, be placed and load its layers while the streams run: slower
    # links make them last long enough on a loaded machine (the texts do not depend on them).
    nodes = start_cluster(link_delay_ms=40)
    joined = []
    streams, fault_at = run_streams(nodes, lambda: joined.append(Node(4, nodes[0], 40)), fault_after=0.5)
    check_streams("a 4th node joined", streams, expected, fault_at)
    check(wait_for(lambda: len(nodes[0].stage_nodes()) == 4, 20),
          f"the 4th node takes a stage ({nodes[0].stage_nodes()})")
    switches = nodes[0].cluster().get("placement_switches", {})
    check(switches.get("sequences_recomputed") == 0 and switches.get("sequences_handed_over", 0) > 0,
          f"a 4th node joined: every running sequence was handed over, none computed again ({switches})")
    stop_all(nodes + joined)

    if FAILURES:
        for log in sorted(f for f in os.listdir("/tmp") if f.startswith(PREFIX)):
            print(f"---- {log}\n" + open(f"/tmp/{log}", errors="replace").read()[-2000:])
    print(f"{len(FAILURES)} failed" if FAILURES else "netns faults: all checks passed")
    return 1 if FAILURES else 0


def cleanup():
    for p in PROCESSES:
        if p.poll() is None:
            p.kill()
    for ns in reversed(NAMESPACES):
        subprocess.run(["ip", "netns", "pids", ns], capture_output=True)
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
    for f in os.listdir("/tmp"):
        if f.startswith(PREFIX):
            os.unlink(f"/tmp/{f}")


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        cleanup()
