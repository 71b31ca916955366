#!/usr/bin/env python3
"""Nodes that must not disturb a cluster, as real `strata serve` processes on 127.0.0.1: a node
whose GGUF differs by one metadata byte (its id the lowest, so it would lead) is left out once,
said once in the log and in /cluster, and the others keep their placement and serve throughout,
while it says why it is alone; a second process under a member's node id is refused with a clear
message on both sides and the placement and that id's address stay put; a member killed and
started again under its own id rejoins.

usage: membership_processes_test.py STRATA MODEL.gguf
"""
import os
import signal
import sys
import tempfile
import time

import cluster_processes_test as base  # noqa: E402  (its Node and checks; its main does not run)
from cluster_processes_test import Node, answer, check, settled, start_cluster, stop_all, FAILURES, REQUESTS

WATCH_SECONDS = 10


def odd_model_file():
    """The shared model with one byte of its name changed: another model hash, the same shapes."""
    with open(base.MODEL, "rb") as f:
        data = f.read()
    at = data.index(b"aidreams260K")
    odd = tempfile.NamedTemporaryFile(prefix="strata-odd-", suffix=".gguf", delete=False)
    odd.write(data[:at] + b"aidreams260X" + data[at + 12:])
    odd.close()
    return odd.name


def watch(node, seconds, label):
    """Polls `node`'s /cluster for `seconds`: the epochs it showed, whether it served at every look,
    and the addresses it showed for each node id."""
    epochs, addresses, always_serving = set(), {}, True
    deadline = time.time() + seconds
    while time.time() < deadline:
        status = node.get("/cluster")[1]
        epochs.add(status["placement"]["epoch"])
        always_serving = always_serving and bool(status["serving"])
        for n in status["nodes"]:
            addresses.setdefault(n["id"], set()).add(n["node_address"])
        time.sleep(0.2)
    check(len(epochs) == 1, f"{label}: the placement stays put at {node.id} (epochs seen: {sorted(epochs)})")
    check(always_serving, f"{label}: {node.id} serves at every look")
    return addresses


def odd_model(reference):
    nodes = start_cluster(["m1", "m2"], "--placement", "memory")
    odd_path = odd_model_file()
    odd = Node("m0", "--peers", nodes[0].address, model=odd_path)
    try:
        deadline = time.time() + 20
        while time.time() < deadline and "is left out" not in nodes[0].text():
            time.sleep(0.1)
        watch(nodes[0], WATCH_SECONDS, "a node of another model")
        for n in nodes:
            lines = [l for l in n.text().splitlines() if "node m0 is left out" in l]
            check(len(lines) == 1 and "runs another model" in lines[0],
                  f"{n.id} says once that the odd node is left out, and why ({lines})")
            problem = next((x.get("problem", "") for x in n.get("/cluster")[1]["nodes"] if x["id"] == "m0"), "")
            check("runs another model" in problem, f"{n.id}'s /cluster names the odd node's problem ('{problem}')")
        check(answer(nodes[1].complete(REQUESTS[0])) == reference[0], "the cluster answers as one node meanwhile")
        alone = odd.text()
        check("m1 at" in alone and "is left out: it runs another model" in alone and "over 1 node(s)" in alone,
              f"the odd node says why it is alone:\n{alone}")
        check(odd.get("/cluster")[1]["leader"] == "m0", "the odd node leads only itself")
    finally:
        odd.stop()
        os.unlink(odd_path)
        stop_all(nodes)


def duplicate_id(reference):
    nodes = start_cluster(["d0", "d1", "d2"], "--placement", "memory")
    address = nodes[2].address
    second = Node("d2", "--peers", nodes[0].address)
    deadline = time.time() + 20
    while time.time() < deadline and "takes no part" not in second.text():
        time.sleep(0.1)
    addresses = watch(nodes[0], WATCH_SECONDS, "a second process under a member's id")
    check(addresses.get("d2") == {address}, f"d2's address stays {address} ({addresses.get('d2')})")
    check(any("refused node d2 at " + second.address in l and "node id 'd2' is taken by the node at " + address in l
              for l in nodes[0].text().splitlines()), f"the cluster says it refused the second d2:\n{nodes[0].text()}")
    said = second.text()
    check("this node takes no part in the cluster: node id 'd2' is taken by the node at " + address in said
          and "--node-id" in said, f"the second d2 says it is refused, and what to do:\n{said}")
    # For longer than twice the 3 s a refusal is remembered: it stays refused, never placing.
    answers = set()
    deadline = time.time() + 7
    while time.time() < deadline:
        status, body = second.get("/health")
        answers.add((status, body.get("status"), "node id 'd2' is taken" in body.get("waiting_for", "")))
        time.sleep(0.25)
    check(answers == {(503, "refused", True)}, f"the second d2's /health says it is refused at every look ({answers})")
    check("placement" not in second.text(), f"the second d2 never placed nor adopted a placement:\n{second.text()}")
    check(answer(nodes[1].complete(REQUESTS[0])) == reference[0], "the cluster answers as one node meanwhile")
    second.stop()

    # The member killed and started again under its own id, on another port: it rejoins.
    nodes[2].process.send_signal(signal.SIGKILL)
    nodes[2].process.wait()
    nodes[2].stop()
    restarted = Node("d2", "--peers", nodes[0].address)
    nodes[2] = restarted

    def rejoined(status):
        stages = [s["node_address"] for s in status["placement"]["stages"] if s["node"] == "d2"]
        return settled(status, 3) and stages == [restarted.address]

    deadline = time.time() + 30
    while time.time() < deadline and not rejoined(nodes[0].get("/cluster")[1]):
        time.sleep(0.2)
    status = nodes[0].get("/cluster")[1]
    if not check(rejoined(status) and restarted.wait_healthy(),
                 f"d2 restarted under its own id rejoins at {restarted.address} ({status['placement']['stages']})"):
        print(nodes[0].text(), restarted.text(), sep="\n")
    check(answer(restarted.complete(REQUESTS[0])) == reference[0], "the restarted node answers as one node")
    stop_all(nodes)


def main():
    alone = Node("solo")
    reference = [answer(alone.complete(r)) for r in REQUESTS[:1]]
    alone.stop()
    odd_model(reference)
    duplicate_id(reference)
    print(f"{len(FAILURES)} failed" if FAILURES else "membership processes: all checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
