#!/usr/bin/env python3
"""A node started without a model file joins two nodes that have it: killed half-way through its
fetch, in the middle of a tensor, and started again, it fetches only what it lacked (a tensor cut
short from its last checkpoint, not from its start), then serves requests with the answers of one
whole-model node (text and logprobs); from an empty cache it receives only the tensors of the
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
# The model's tensors are 128 KiB at most: sent in chunks of 8 KiB, with a checkpoint every 16 KiB,
# a fetch can be killed mid-tensor.
CHUNK = 8192
CHECKPOINT = 16384
STREAMS = 4


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


def wait_placed(node, timeout=60):
    """Until `node` holds its layers of the fixed placement: after its loss the nodes left served
    repaired, and a node that comes back gets its layers again in a placement of its own."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        status = node.get("/cluster")[1]
        placement = status.get("placement", {})
        own = next((n for n in status.get("nodes", []) if n["self"]), {})
        if any(s["node"] == node.id for s in placement.get("stages", [])) and own.get("ready_epoch") == placement["epoch"]:
            return True
        time.sleep(0.1)
    return False


def weights_of(node):
    return next(n["weights"] for n in node.get("/cluster")[1]["nodes"] if n["self"])


def records(cache, name):
    """The whole lines of the list `name` ("verified", "progress") beside the partial model, as
    tensor index -> the rest of its last line."""
    for root, _, files in os.walk(cache):
        if name in files:
            with open(os.path.join(root, name), encoding="utf-8") as f:
                return {int(line.split()[0]): line.split()[1] for line in f if line.endswith("\n")}
    return {}


def unfinished(cache):
    """Tensor index -> bytes its last checkpoint claims, for the tensors not verified."""
    verified = records(cache, "verified")
    return {i: int(b) for i, b in records(cache, "progress").items() if i not in verified and int(b) > 0}


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
        serving = ("--stages", STAGES, "--test-tensor-chunk-bytes", str(CHUNK))
        a = Node("a", *serving)
        b = Node("b", *serving, "--peers", a.address)
        # Slowed so that it can be killed mid-way, once a tensor not yet whole has a checkpoint.
        c = Node("c", "--stages", STAGES, "--peers", a.address, "--cache-dir", cache,
                 "--test-fetch-delay-ms", "200", "--test-fetch-checkpoint-bytes", str(CHECKPOINT), model=None)
        table = list(sizes.values())
        deadline = time.time() + 20
        while time.time() < deadline and not (records(cache, "verified")
                                              and any(b < table[i] for i, b in unfinished(cache).items())):
            time.sleep(0.02)
        received_before_kill = c.get("/health")[1]["transfer"]["received_bytes"]
        c.process.send_signal(signal.SIGKILL)
        c.process.wait()
        verified = records(cache, "verified")
        resumable = unfinished(cache)
        check(0 < len(verified) < 11, f"the fetch was killed half-way ({len(verified)} of 11 tensors verified)")
        check(any(b < table[i] for i, b in resumable.items()),
              f"it was killed mid-tensor, with checkpoints of unfinished tensors ({resumable})")
        held_when_killed = sum(table[i] for i in verified) + sum(resumable.values())

        c = Node("c", "--stages", STAGES, "--peers", a.address, "--cache-dir", cache, model=None)
        healthy = all(n.wait_healthy() for n in (a, b, c)) and wait_placed(c)
        if not check(healthy, "the node without a file joined, holds its layers, and the cluster serves"):
            print(c.text())
        weights = weights_of(c)
        print(f"after the restart: {weights}", flush=True)
        check(not weights["whole_file"] and weights["layer_bytes"][:3] == [0, 0, 0] and weights["head"],
              f"it holds layer 3 and the head only ({weights})")
        check(weights["held_at_start_bytes"] == held_when_killed,
              f"the restarted node resumed with what it had verified and the checkpointed parts "
              f"({weights['held_at_start_bytes']} bytes held at the start, {held_when_killed} on record)")
        check(weights["held_at_start_bytes"] + weights["fetch_received_bytes"] == share,
              f"it fetched only what it lacked: {weights['fetch_received_bytes']} + {weights['held_at_start_bytes']} "
              f"held = its layers' {share} bytes")
        check(weights["received_bytes"] < share, "after the restart it received less than its share")
        # What the kill lost: per tensor in flight, what came after its last checkpoint.
        both_runs = received_before_kill + weights["received_bytes"]
        check(both_runs <= share + STREAMS * CHECKPOINT,
              f"both runs received {both_runs} bytes: its layers' {share}, and less than a checkpoint's worth "
              f"again per stream")
        for n in (a, c):
            for i, r in enumerate(REQUESTS[:4]):
                check(answer(n.complete(r)) == reference[i], f"request {i} at {n.id} equals one node's")

        # From an empty cache: its layers' share of the file, not the whole file.
        c.stop()
        shutil.rmtree(cache)
        c = Node("c", "--stages", STAGES, "--peers", a.address, "--cache-dir", cache, model=None)
        check(c.wait_healthy() and wait_placed(c), "the node without a file serves from an empty cache")
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
