#!/usr/bin/env python3
"""Real `strata serve` processes on 127.0.0.1 form clusters of 1 to 4 nodes; every node's
answers equal one whole-model node's, bit for bit (text and logprobs), alone and concurrently;
no node keeps sequence state afterwards, also when a client leaves mid-stream or while its
request waits for a new placement after a loss; a stage or the
leader killed mid-stream pauses the stream while the others re-form, and its whole text is still
the fault-free one; a node drained mid-stream (`strata drain`) hands its state over and exits, and
so does a drained leader, whose requests the next leader takes over with their state, once its
own client's stream has ended; a
node with the wrong cluster key is refused.

usage: cluster_processes_test.py STRATA MODEL.gguf
"""
import concurrent.futures
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

STRATA, MODEL = sys.argv[1], sys.argv[2]
FAILURES = []


def check(condition, message):
    if not condition:
        FAILURES.append(message)
        print("FAIL " + message, flush=True)
    return condition


class Node:
    def __init__(self, node_id, *extra, model=MODEL):
        """Without a model (None), the node takes its peers' model and fetches its weights."""
        self.id = node_id
        self.log = tempfile.NamedTemporaryFile(prefix=f"strata-{node_id}-", suffix=".log", delete=False)
        args = ([STRATA, "serve"] + (["-m", model] if model else []) +
                ["--port", "0", "--node-id", node_id, "-t", "1", "--parallel", "8", "--startup-wait", "20"] + list(extra))
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self.log)
        self.port = self.node_port = None
        deadline = time.time() + 20
        while time.time() < deadline and (self.port is None or self.node_port is None):
            text = self.text()
            if m := re.search(r"serving \S+ on http://127.0.0.1:(\d+)", text):
                self.port = int(m.group(1))
            if m := re.search(r"listens for nodes on [0-9.]+:(\d+)", text):
                self.node_port = int(m.group(1))
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        if self.port is None or self.node_port is None:
            raise RuntimeError(f"node {node_id} did not start:\n{self.text()}")

    def text(self):
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            return f.read()

    @property
    def address(self):
        return f"127.0.0.1:{self.node_port}"

    def get(self, path):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def post(self, path, body, timeout=60):
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=json.dumps(body).encode(),
                                         method="POST", headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def complete(self, body, timeout=60):
        return self.post("/v1/completions", body, timeout)

    def stream(self, path, body):
        """A streamed answer: its text and the usage of its last chunk."""
        body = dict(body, stream=True, stream_options={"include_usage": True})
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=json.dumps(body).encode(),
                                         method="POST", headers={"Content-Type": "application/json"})
        text, usage = "", None
        with urllib.request.urlopen(request, timeout=60) as r:
            for line in r:
                if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                for choice in chunk.get("choices", []):
                    text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                usage = chunk.get("usage") or usage
        return text, usage

    def wait_healthy(self, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if self.get("/health")[0] == 200:
                    return True
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.1)
        return False

    def held_sequences(self):
        return next(n["held_sequences"] for n in self.get("/cluster")[1]["nodes"] if n["self"])

    def stop(self, sig=signal.SIGTERM):
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        os.unlink(self.log.name)


def settled(status, stage_count):
    """Whether a node's /cluster `status` shows a placement over `stage_count` stages that every
    stage holds and the leader serves."""
    placement = status.get("placement", {})
    ready = {n["id"]: n["ready_epoch"] for n in status.get("nodes", [])}
    return (bool(status.get("serving")) and len(placement.get("stages", [])) == stage_count
            and all(ready.get(s["node"]) == placement["epoch"] for s in placement["stages"]))


def start_cluster(ids, *extra):
    """The first node alone, then the others naming only it: membership spreads from there.
    Returns once the placement uses every node (as every placement of these tests does). A node
    is healthy as soon as any placement serves, which may be one made before the last nodes
    joined, on a loaded machine: the leader places the model again over all of them a second
    later, and a test that started meanwhile would see that switch."""
    first = Node(ids[0], *extra)
    nodes = [first] + [Node(i, "--peers", first.address, *extra) for i in ids[1:]]
    for n in nodes:
        if not check(n.wait_healthy(), f"node {n.id} of {len(ids)} became healthy"):
            print(n.text())
    deadline = time.time() + 30
    while time.time() < deadline and not settled(first.get("/cluster")[1], len(ids)):
        time.sleep(0.2)
    check(settled(first.get("/cluster")[1], len(ids)) and all(n.wait_healthy() for n in nodes),
          f"{len(ids)} node(s): the placement uses every node ({first.get('/cluster')[1]['placement']['stages']})")
    return nodes


def stop_all(nodes):
    """All at once: nodes that leave together wait for no one to take over."""
    for n in nodes:
        if n.process.poll() is None:
            n.process.send_signal(signal.SIGTERM)
    for n in nodes:
        n.stop()


# Greedy and seeded requests, each with logprobs, so that any difference in the logits shows.
REQUESTS = [
    {"prompt": p, "max_tokens": 24, "temperature": t, "seed": s, "logprobs": 2}
    for p, t, s in [("Once upon a time", 0, 1), ("The robot", 0.9, 7), ("In a dream I saw", 1.2, 99),
                    ("Colours", 0, 3), ("A city of glass", 0.7, 11), ("The moon", 0.8, 5),
                    ("Silence", 0, 8), ("My cat", 1.0, 42)]
]


LONG_REQUEST = {"prompt": "Once upon a time", "max_tokens": 100, "temperature": 0}
LONG_SEEDED = {"prompt": "The robot", "max_tokens": 100, "temperature": 0.9, "seed": 7}


def stream_through(entry, request, event):
    """Streams `request` from `entry` and calls `event` a second in; the whole text, whether an
    error event came, the raw stream, and how long after the event the next token came."""
    stream = subprocess.Popen(["curl", "-sN", "--max-time", "90", f"http://127.0.0.1:{entry.port}/v1/completions",
                               "-H", "Content-Type: application/json", "-d", json.dumps(request | {"stream": True})],
                              stdout=subprocess.PIPE, text=True)
    lines = []
    reader = threading.Thread(target=lambda: [lines.append((time.time(), line)) for line in stream.stdout])
    reader.start()
    time.sleep(1.0)
    event_at = time.time()
    event()
    stream.wait(timeout=120)
    reader.join()
    after = [t for t, line in lines if line.startswith("data: {") and t > event_at]
    events = [json.loads(line[6:]) for _, line in lines if line.startswith("data: {")]
    text = "".join(e["choices"][0]["text"] for e in events if "choices" in e)
    return (text, any("error" in e for e in events), "".join(line for _, line in lines),
            after[0] - event_at if after else -1.0)


def stream_through_a_kill(entry, victim, request):
    """Streams `request` from `entry`, SIGKILLs `victim` a second in; the text and whether an
    error event came."""
    text, error, out, pause = stream_through(entry, request, lambda: victim.process.send_signal(signal.SIGKILL))
    print(f"node {victim.id} killed: the next token came {pause:.2f} s later", flush=True)
    return text, error, out


def drain_mid_stream(label, entry, leaving, leader_after, reference):
    """Streams LONG_SEEDED from `entry` and runs `strata drain` on `leaving` a second in; checks
    that the whole text is `reference`, that `strata drain` reports the node gone, and that
    `leader_after` took the sequence's state over without computing it again. Returns the text."""
    drains = []
    text, error, out, pause = stream_through(entry, LONG_SEEDED, lambda: drains.append(subprocess.Popen(
        [STRATA, "drain", "--port", str(leaving.port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    drained = drains[0].communicate(timeout=120)[0]
    print(f"{label}: the next token came {pause:.2f} s later", flush=True)
    check(not error and text == reference, f"{label}: the whole text equals the fault-free run's ({text!r}) ...{out[-300:]}")
    check(drains[0].returncode == 0 and "has left" in drained, f"{label}: `strata drain` reports the node gone: {drained}")
    switches = leader_after.get("/cluster")[1].get("placement_switches", {})
    check(switches.get("sequences_recomputed") == 0 and switches.get("sequences_handed_over") == 1,
          f"{label}: the sequence's state was taken over, not computed again ({switches})")
    return text


def answer(status_body):
    status, body = status_body
    if status != 200:
        return ("error", status, body)
    choice = body["choices"][0]
    return (choice["text"], choice["finish_reason"], choice["logprobs"])


def check_no_state(nodes, label):
    deadline = time.time() + 30
    while any(held := [n.held_sequences() for n in nodes]) and time.time() < deadline:
        time.sleep(0.1)
    for n, h in zip(nodes, held):
        check(h == 0, f"{label}: node {n.id} holds no sequence state after the requests ({h})")


def main():
    solo = start_cluster(["solo"])
    reference = [answer(solo[0].complete(r)) for r in REQUESTS]
    long_reference = solo[0].complete(LONG_REQUEST)[1]["choices"][0]["text"]
    seeded_reference = solo[0].complete(LONG_SEEDED)[1]["choices"][0]["text"]
    stop_all(solo)
    check(all(r[0] != "error" for r in reference), f"the single node answers: {reference}")

    for count in (2, 3, 4):
        nodes = start_cluster([f"n{i}" for i in range(count)], "--placement", "memory")
        for n in nodes:
            for i, r in enumerate(REQUESTS[:4]):
                check(answer(n.complete(r)) == reference[i], f"{count} nodes: request {i} at {n.id} equals one node's")
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(nodes[i % count].complete, r) for i, r in enumerate(REQUESTS)]
            for i, f in enumerate(futures):
                check(answer(f.result()) == reference[i],
                      f"{count} nodes: concurrent request {i} at {nodes[i % count].id} equals one node's")
        check_no_state(nodes, f"{count} nodes")
        table = subprocess.run([STRATA, "cluster", "--port", str(nodes[-1].port)], capture_output=True, text=True)
        check(table.returncode == 0 and all(n.id in table.stdout for n in nodes) and "serving" in table.stdout,
              f"{count} nodes: `strata cluster` lists every node:\n{table.stdout}{table.stderr}")
        stop_all(nodes)

    # The seed's four Mac minis in miniature: usable memory 16:16:32:32, none able to hold the
    # model (2 MiB with the f16 KV reserve of 8 sequences of 128 tokens) alone.
    for strategy in ("memory", "speed"):
        limits = ["800KiB", "800KiB", "1600KiB", "1600KiB"]
        first = Node("m0", "--placement", strategy, "--memory-limit", limits[0])
        nodes = [first] + [Node(f"m{i}", "--peers", first.address, "--placement", strategy, "--memory-limit", limits[i])
                           for i in range(1, 4)]
        healthy = all(n.wait_healthy() for n in nodes)
        placement = nodes[0].get("/cluster")[1]["placement"]
        check(healthy and len(placement["stages"]) >= 2,
              f"seed cluster, {strategy}: placed over several nodes: {placement}")
        if not healthy:
            print(nodes[0].text())
        for i, r in enumerate(REQUESTS[:3]):
            check(answer(nodes[3].complete(r)) == reference[i], f"seed cluster, {strategy}: request {i} equals one node's")
        stop_all(nodes)

    # A placement fixed by hand, in an order that is not the ids' order.
    first = Node("f0", "--stages", "f1:0-2,f0:3-3")
    second = Node("f1", "--peers", first.address, "--stages", "f1:0-2,f0:3-3")
    check(first.wait_healthy() and second.wait_healthy(), "a fixed placement serves")
    stages = [(s["node"], s["first_layer"], s["last_layer"]) for s in first.get("/cluster")[1]["placement"]["stages"]]
    check(stages == [("f1", 0, 3), ("f0", 3, 4)], f"the fixed placement is the one given ({stages})")
    check(answer(first.complete(REQUESTS[2])) == reference[2], "the fixed placement answers as one node")
    stop_all([first, second])

    # A model that cannot fit: 503 with Retry-After and the missing memory named.
    small = Node("small", "--memory-limit", "300KiB")
    status, body = small.complete(REQUESTS[0], timeout=30)
    check(status == 503 and "missing" in json.dumps(body), f"a model that does not fit: 503 naming what is missing ({status} {body})")
    check(small.get("/health")[0] == 503, "a node whose model does not fit is not healthy")
    small.stop()

    # Two nodes that hold the model only together, one killed mid-stream: the stream ends with an
    # error that says what is missing, and so does /cluster.
    nodes = start_cluster(["m0", "m1"], "--memory-limit", "1536KiB", "--placement", "memory",
                          "--test-link-delay-ms", "60")
    # Neither can be drained: the other alone cannot hold the model. It says so, and stays.
    refused = subprocess.run([STRATA, "drain", "--port", str(nodes[1].port)], capture_output=True, text=True, timeout=60)
    check(refused.returncode != 0 and "cannot hold the model" in refused.stderr and "--force" in refused.stderr,
          f"`strata drain` on a node the cluster cannot do without is refused, saying why: {refused.stderr.strip()}")
    check(nodes[1].process.poll() is None and nodes[1].get("/health")[0] == 200, "the node refused to drain serves on")
    text, error, out, _ = stream_through(nodes[0], LONG_SEEDED, lambda: nodes[1].process.send_signal(signal.SIGKILL))
    check(error and "does not fit" in out and "missing" in out,
          f"the model no longer fits: the stream ends with an error naming what is missing: ...{out[-300:]}")
    placement_error = nodes[0].get("/cluster")[1]["placement"]["error"]
    check("missing" in placement_error, f"the model no longer fits: /cluster says what is missing ({placement_error})")
    stop_all(nodes)

    # A stage lost mid-stream, and a client that leaves mid-stream.
    nodes = start_cluster(["k0", "k1", "k2"], "--placement", "memory", "--test-link-delay-ms", "20")
    # A client that goes away mid-stream at a node that is not the leader: every stage lets its
    # sequence go.
    connection = http.client.HTTPConnection("127.0.0.1", nodes[2].port, timeout=30)
    connection.request("POST", "/v1/completions", json.dumps({"prompt": "Once upon a time", "max_tokens": 100,
                                                                "stream": True}), {"Content-Type": "application/json"})
    response = connection.getresponse()
    tokens = 0
    while tokens < 2:  # the first event may come before the first token
        line = response.readline()
        if not line:
            break
        tokens += line.startswith(b"data: ") and b'"text":""' not in line
    check(tokens == 2, "a stream starts at a node that is not the leader")
    check(any(n.held_sequences() for n in nodes), "while it runs, the stages hold its sequence")
    connection.close()
    check_no_state(nodes, "a client gone mid-stream")
    # The last stage killed mid-stream: the stream pauses while the others place the model anew,
    # then goes on there, recomputed from its tokens, and its whole text is the fault-free one.
    stage_ranges = lambda: [(s["node"], s["first_layer"], s["last_layer"])  # noqa: E731
                            for s in nodes[0].get("/cluster")[1]["placement"]["stages"]]
    before = stage_ranges()
    text, error, out = stream_through_a_kill(nodes[1], nodes[2], LONG_REQUEST)
    check(not error, f"a stage lost: the stream's client hears no error: ...{out[-300:]}")
    check(text == long_reference, f"a stage lost: the stream's whole text equals the fault-free run's ({text!r})")
    # The placement is repaired: the nodes left keep their layers, the stage before the lost
    # one takes its layers over.
    after = stage_ranges()
    check(before[-1][0] == "k2" and after == before[:-2] + [(before[-2][0], before[-2][1], before[-1][2])],
          f"a stage lost: the nodes left keep their layers ({before} -> {after})")
    check(nodes[1].get("/health")[0] in (200, 503), "the other nodes keep answering the API")
    deadline = time.time() + 30
    result = None
    while time.time() < deadline:
        result = answer(nodes[1].complete(REQUESTS[0], timeout=30))
        if result[0] != "error":
            break
        time.sleep(0.5)
    check(result == reference[0], f"after the cluster re-formed, a new request equals one node's ({result})")
    stop_all(nodes)

    # Clients that leave while their requests wait for a new placement: the requests end then or,
    # computed again on it, at their first token, and no stage keeps their state.
    nodes = start_cluster(["g0", "g1", "g2"], "--placement", "memory", "--test-link-delay-ms", "20")
    connections = []
    for i, r in enumerate(REQUESTS[:3]):
        connection = http.client.HTTPConnection("127.0.0.1", nodes[i % 2].port, timeout=30)
        connection.request("POST", "/v1/completions", json.dumps(r | {"max_tokens": 100, "stream": True}),
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        response.readline()
        response.readline()
        connections.append(connection)
    time.sleep(0.5)
    nodes[2].process.send_signal(signal.SIGKILL)
    for connection in connections:
        connection.close()
    deadline = time.time() + 30
    while time.time() < deadline and not settled(nodes[0].get("/cluster")[1], 2):
        time.sleep(0.1)
    check(settled(nodes[0].get("/cluster")[1], 2), "clients gone during a loss: the nodes left serve a new placement")
    check_no_state(nodes[:2], "clients gone during a loss")
    stop_all(nodes)

    # The leader killed mid-stream, with seeded sampling: the request entered elsewhere resumes at
    # the next leader from the tokens it has, with the same text.
    nodes = start_cluster(["l0", "l1", "l2"], "--placement", "memory", "--test-link-delay-ms", "20")
    text, error, out = stream_through_a_kill(nodes[2], nodes[0], LONG_SEEDED)
    check(not error, f"the leader lost: the stream's client hears no error: ...{out[-300:]}")
    check(text == seeded_reference, f"the leader lost: the whole text equals the fault-free run's ({text!r})")
    stop_all(nodes)

    # A node with a lower id joins mid-stream: it becomes the leader, and the request scheduled by
    # the old leader moves to it with its state and goes on with the same text.
    nodes = start_cluster(["j1", "j2"], "--placement", "memory", "--test-link-delay-ms", "60")
    joined = []
    text, error, out, _ = stream_through(nodes[0], LONG_SEEDED, lambda: joined.append(
        Node("j0", "--peers", nodes[0].address, "--placement", "memory", "--test-link-delay-ms", "60")))
    newcomer = joined[0]
    check(not error, f"a node joined: no error: ...{out[-300:]}")
    check(text == seeded_reference, f"a node joined: the whole text equals the fault-free run's ({text!r})")
    check(newcomer.get("/cluster")[1]["leader"] == "j0", "the newcomer with the lowest id leads")
    check("passed a request on" in nodes[0].text(), "the request moved to the new leader mid-stream")
    switches = newcomer.get("/cluster")[1].get("placement_switches", {})
    check(switches.get("sequences_recomputed") == 0 and switches.get("sequences_handed_over") == 1,
          f"a node joined: the new leader took the request's state over, computing nothing again ({switches})")
    stop_all(nodes + [newcomer])

    # `strata drain` on a stage mid-stream: the node leaves, handing its sequence's state over,
    # and exits; nothing is computed again and the text is the fault-free one.
    nodes = start_cluster(["d0", "d1", "d2"], "--placement", "memory", "--test-link-delay-ms", "20")
    text = drain_mid_stream("a stage drained", nodes[0], nodes[2], nodes[0], seeded_reference)
    try:  # `strata drain` returns once the node stops answering; it may still be shutting down
        nodes[2].process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    check(nodes[2].process.poll() is not None, "the drained node has exited")
    # The handed-over blocks entered the new stages' prefix caches: a second turn reuses them.
    status, body = nodes[0].complete({"prompt": LONG_SEEDED["prompt"] + text, "max_tokens": 1, "temperature": 0})
    cached = body.get("usage", {}).get("prompt_tokens_details", {}).get("cached_tokens", 0) if status == 200 else -1
    check(cached >= 16, f"a node drained: the next turn reuses the handed-over blocks ({cached} cached tokens)")
    stop_all(nodes)

    # The leader drained mid-stream, with the stream entering there: it goes on scheduling until
    # the next leader serves, then passes the request on with its state, which the next leader
    # moves to its stages; it relays the tokens to its client to the end, and only then exits.
    nodes = start_cluster(["e0", "e1", "e2"], "--placement", "memory", "--test-link-delay-ms", "20")
    drain_mid_stream("the leader drained", nodes[0], nodes[0], nodes[1], seeded_reference)
    check_no_state(nodes[1:], "the leader drained")
    stop_all(nodes)

    # Only holders of the cluster key take part.
    # No discovery: keyed nodes would announce on this machine's LAN, where another run of
    # this test could join them.
    keyed = start_cluster(["c0", "c1"], "--cluster-key", "right", "--placement", "memory", "--no-discovery")
    stranger = Node("c2", "--peers", keyed[0].address, "--cluster-key", "wrong", "--no-discovery")
    deadline = time.time() + 30
    while time.time() < deadline and not ("refused" in keyed[0].text() or "refused" in stranger.text()):
        time.sleep(0.2)
    check("refused" in keyed[0].text() or "refused" in stranger.text(), "the refusal is logged")
    members = [n["id"] for n in keyed[0].get("/cluster")[1]["nodes"]]
    check("c2" not in members, f"a node with the wrong key is not a member ({members})")
    check(answer(keyed[1].complete(REQUESTS[1])) == reference[1], "the keyed cluster answers as one node")
    stranger.stop()
    stop_all(keyed)

    print(f"{len(FAILURES)} failed" if FAILURES else "cluster processes: all checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
