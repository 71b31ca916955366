#!/usr/bin/env python3
"""How a `strata serve` starts when things around it are not as planned: a single node whose
default node port (--port + 1) is taken listens for nodes on another one and serves, and says
which; one given a taken --node-port exits with an error saying so; a node without a model file
whose peer is dead answers /health (503, saying it waits for that peer's manifest) and requests
(503) until the peer comes, then serves its model. Whatever goes wrong, every line on stderr is
Strata's: gRPC's own log lines go through Strata's log.

usage: node_startup_test.py STRATA MODEL.gguf
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from cluster_processes_test import STRATA, MODEL, FAILURES, check  # noqa: E402  (its main does not run)


def listening_socket(port):
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def free_ports(count):
    """`count` consecutive ports nothing listens on."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        if first + count > 65535:
            continue
        try:
            for s in [listening_socket(first + i) for i in range(count)]:
                s.close()
            return first
        except OSError:
            continue


def request(port, path, body=None):
    """(status, JSON body, headers), or None when nothing answers."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read()), r.headers
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}"), e.headers
    except (urllib.error.URLError, ConnectionError):
        return None


def wait_for(condition, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if value := condition():
            return value
        time.sleep(0.1)
    return None


class Serve:
    def __init__(self, *args):
        self.log = tempfile.NamedTemporaryFile(prefix="strata-startup-", suffix=".log", delete=False)
        self.process = subprocess.Popen([STRATA, "serve", "--no-discovery", "-t", "1"] + list(args),
                                        stdout=subprocess.DEVNULL, stderr=self.log)

    def healthy(self, port, timeout):
        """Whether it answers /health with 200 within `timeout` seconds; false as soon as it exits."""
        def answered():
            if self.process.poll() is not None:
                return "exited"
            return (request(port, "/health") or [0])[0] == 200 or None
        return wait_for(answered, timeout) is True

    def text(self):
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            return f.read()

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=20)
        os.unlink(self.log.name)


def foreign_lines(text):
    """Lines on stderr in another format than Strata's (gRPC's own: 'E1201 14:12:32.216266 ...')."""
    return [line for line in text.splitlines() if line and not line.startswith(("strata", "  "))]


def default_node_port_taken():
    port = free_ports(2)
    occupied = listening_socket(port + 1)
    node = Serve("-m", MODEL, "--port", str(port), "--node-id", "solo")
    try:
        healthy = node.healthy(port, 30)
        text = node.text()
        if not check(healthy, f"a node whose default node port {port + 1} is taken serves"):
            print(text)
        taken = re.search(rf"cannot listen for nodes on 127\.0\.0\.1:{port + 1}: Address already in use; "
                          r"listening on any free port instead", text)
        listens = re.search(r"listens for nodes on 127\.0\.0\.1:(\d+)", text)
        check(taken and listens and int(listens.group(1)) not in (0, port + 1),
              f"it says the default node port was taken and which one it took:\n{text}")
        check(not foreign_lines(text), f"no raw gRPC line: {foreign_lines(text)}")
    finally:
        node.stop()
        occupied.close()


def given_node_port_taken():
    port = free_ports(2)
    occupied = listening_socket(port + 1)
    try:
        result = subprocess.run([STRATA, "serve", "-m", MODEL, "--port", str(port), "--node-port", str(port + 1),
                                 "--node-id", "solo", "--no-discovery", "-t", "1"],
                                capture_output=True, text=True, timeout=60)
    finally:
        occupied.close()
    lines = result.stderr.splitlines()
    check(result.returncode != 0 and lines and lines[-1] == f"strata: error: cannot listen for nodes on "
                                                           f"127.0.0.1:{port + 1}: Address already in use",
          f"a taken --node-port is an error saying so (exit {result.returncode}):\n{result.stderr}")
    check(not foreign_lines(result.stderr), f"no raw gRPC line: {foreign_lines(result.stderr)}")


def dead_peer():
    ports = free_ports(5)  # the waiting node's API and node ports, the peer's, and its node port
    api, peer_api, peer_node = ports, ports + 2, ports + 4
    cache = tempfile.mkdtemp(prefix="strata-startup-cache-")
    waiting = Serve("--port", str(api), "--node-id", "w", "--peers", f"127.0.0.1:{peer_node}", "--cache-dir", cache)
    peer = None
    try:
        health = wait_for(lambda: request(api, "/health"), 20)
        if not check(health and health[0] == 503, f"a node waiting for a dead peer answers /health with 503 ({health})"):
            print(waiting.text())
        why = health[1].get("waiting_for", "") if health else ""
        check(health and health[1].get("status") == "waiting" and
              why == f"the model's manifest from peer 127.0.0.1:{peer_node}",
              f"/health says it waits for the peer's manifest: {health and health[1]}")
        completion = request(api, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4})
        check(completion and completion[0] == 503 and completion[2].get("Retry-After") and
              why in completion[1].get("error", {}).get("message", ""),
              f"a request meanwhile gets 503 with Retry-After, saying what the node waits for: {completion}")

        peer = Serve("-m", MODEL, "--port", str(peer_api), "--node-port", str(peer_node), "--node-id", "a")
        served = waiting.healthy(api, 60)
        if not check(served, "once the peer runs, the waiting node serves"):
            print(waiting.text())
        body = {"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}
        answers = [request(p, "/v1/completions", body) for p in (api, peer_api)]
        check(all(a and a[0] == 200 for a in answers) and
              answers[0][1]["choices"][0]["text"] == answers[1][1]["choices"][0]["text"],
              f"it serves the peer's model, with the peer's answer: {answers}")
        check(not foreign_lines(waiting.text()), f"no raw gRPC line: {foreign_lines(waiting.text())}")
    finally:
        for node in (waiting, peer):
            if node:
                node.stop()
        shutil.rmtree(cache, ignore_errors=True)


def main():
    default_node_port_taken()
    given_node_port_taken()
    dead_peer()
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
