#!/usr/bin/env python3
"""A node started without a model file joins two nodes that have it: killed half-way through its
fetch and started again, it fetches only what it lacked, then serves requests with the answers of
one whole-model node (text and logprobs); from an empty cache it receives only the tensors of the
layers placed on it and the head.

usage: peer_weights_test.py STRATA MODEL.gguf
"""
import os
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gguf"))
import cluster_processes_test as cluster  # noqa: E402  (reads STRATA and MODEL from argv too)
from cluster_processes_test import Node, answer, check, stop_all, REQUESTS, FAILURES  # noqa: E402
from independent_reader import BLOCKS, Reader  # noqa: E402

# Layer 3 and the head on the node without a file; the others keep theirs.
STAGES = "a:0-1,b:2-2,c:3-3"


def tensor_sizes(path):
    """name -> bytes, from the file's tensor table."""
    with open(path, "rb") as f:
        r = Reader(f.read())
    r.pos = 4
    _, n_tensors, n_kv = r.take("<I"), r.take("<Q"), r.take("<Q")
    for _ in range(n_kv):
        r.string()
        r.value(r.take("<I"))
    sizes = {}
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.take("<Q") for _ in range(r.take("<I"))]
        kind = r.take("<I")
        r.take("<Q")
        elements = 1
        for d in dims:
            elements *= d
        per_block, block_bytes = BLOCKS[kind]
        sizes[name] = elements // per_block * block_bytes
    return sizes


def weights_of(node):
    return next(n["weights"] for n in node.get("/cluster")[1]["nodes"] if n["self"])


def verified_count(cache):
    lists = [os.path.join(root, "verified") for root, _, files in os.walk(cache) if "verified" in files]
    if not lists:
        return 0
    with open(lists[0], encoding="utf-8") as f:
        return sum(1 for line in f if line.endswith("\n"))


def main():
    solo = Node("solo")
    check(solo.wait_healthy(), "the single node became healthy")
    reference = [answer(solo.complete(r)) for r in REQUESTS[:4]]
    stop_all([solo])

    sizes = tensor_sizes(cluster.MODEL)
    share = sum(size for name, size in sizes.items()
                if name.startswith("blk.3.") or name in ("output.weight", "output_norm.weight"))
    whole = os.path.getsize(cluster.MODEL)
    cache = tempfile.mkdtemp(prefix="strata-peer-weights-")
    try:
        a = Node("a", "--stages", STAGES)
        b = Node("b", "--stages", STAGES, "--peers", a.address)
        # Slowed so that it can be killed mid-way: every tensor of this model is one chunk.
        c = Node("c", "--stages", STAGES, "--peers", a.address, "--cache-dir", cache,
                 "--test-fetch-delay-ms", "1000", model=None)
        deadline = time.time() + 20
        while time.time() < deadline and verified_count(cache) == 0:
            time.sleep(0.02)
        held_when_killed = verified_count(cache)
        c.process.send_signal(signal.SIGKILL)
        c.process.wait()
        check(0 < held_when_killed < 11, f"the fetch was killed half-way ({held_when_killed} of 11 tensors verified)")

        c = Node("c", "--stages", STAGES, "--peers", a.address, "--cache-dir", cache, model=None)
        healthy = all(n.wait_healthy() for n in (a, b, c))
        if not check(healthy, "the node without a file joined and the cluster serves"):
            print(c.text())
        weights = weights_of(c)
        print(f"after the restart: {weights}", flush=True)
        check(not weights["whole_file"] and weights["layer_bytes"][:3] == [0, 0, 0] and weights["head"],
              f"it holds layer 3 and the head only ({weights})")
        check(weights["held_at_start_bytes"] > 0, "the restarted node resumed with what it had verified")
        check(weights["held_at_start_bytes"] + weights["fetch_received_bytes"] == share,
              f"it fetched only what it lacked: {weights['fetch_received_bytes']} + {weights['held_at_start_bytes']} "
              f"held = its layers' {share} bytes")
        check(weights["received_bytes"] < share, "after the restart it received less than its share")
        for n in (a, c):
            for i, r in enumerate(REQUESTS[:4]):
                check(answer(n.complete(r)) == reference[i], f"request {i} at {n.id} equals one node's")

        # From an empty cache: its layers' share of the file, not the whole file.
        c.stop()
        shutil.rmtree(cache)
        c = Node("c", "--stages", STAGES, "--peers", a.address, "--cache-dir", cache, model=None)
        check(c.wait_healthy(), "the node without a file serves from an empty cache")
        received = weights_of(c)["received_bytes"]
        check(abs(received - share) <= 0.05 * share,
              f"it received {received} bytes: its layers' {share}, not the file's {whole}")
        check(answer(c.complete(REQUESTS[0])) == reference[0], "a request at it equals one node's")
        stop_all([a, b, c])
    finally:
        shutil.rmtree(cache, ignore_errors=True)

    print(f"{len(FAILURES)} failed" if FAILURES else "peer weights: all checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
