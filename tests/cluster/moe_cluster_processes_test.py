#!/usr/bin/env python3
"""A model of a newer architecture (`strata gguf synth --shape SHAPE`, Q8_0: qwen3moe-tiny,
Qwen3-MoE with 2 of 8 experts per token and QK-norm, by default; gpt-oss-tiny, experts, sinks
and sliding-window layers; gemma3-tiny, sliding-window layers and GeGLU; deepseek2-tiny, latent
attention whose cache holds the latent, and groups of experts) served by real
`strata serve` processes on 127.0.0.1: a cluster of three answers every greedy and seeded
request (text and logprobs) at every node as one node does, alone and concurrently, and a stage
killed mid-stream leaves the whole text the fault-free one.

usage: moe_cluster_processes_test.py STRATA [SHAPE]
"""
import concurrent.futures
import os
import signal
import subprocess
import sys
import tempfile

STRATA = sys.argv[1]
SHAPE = sys.argv[2] if len(sys.argv) > 2 else "qwen3moe-tiny"
WORK = tempfile.mkdtemp(prefix="strata-moe-")
MOE = os.path.join(WORK, f"{SHAPE}-q8_0.gguf")
subprocess.run([STRATA, "gguf", "synth", "--shape", SHAPE, "--type", "Q8_0", "-o", MOE], check=True,
               capture_output=True)
sys.argv[2:] = [MOE]  # the model every Node of cluster_processes_test starts with

from cluster_processes_test import (FAILURES, LONG_SEEDED, REQUESTS, answer, check, check_no_state,  # noqa: E402
                                    start_cluster, stop_all, stream_through)


def main():
    try:
        solo = start_cluster(["solo"])
        reference = [answer(solo[0].complete(r)) for r in REQUESTS]
        seeded_reference = solo[0].complete(LONG_SEEDED)[1]["choices"][0]["text"]
        stop_all(solo)
        check(all(r[0] != "error" for r in reference), f"the single node answers: {reference}")

        # 20 ms a stage call, as a LAN's: the stream is still going when its last stage is killed.
        nodes = start_cluster(["e0", "e1", "e2"], "--placement", "memory", "--test-link-delay-ms", "20")
        for n in nodes:
            for i, r in enumerate(REQUESTS[:4]):
                check(answer(n.complete(r)) == reference[i], f"3 nodes: request {i} at {n.id} equals one node's")
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(nodes[i % 3].complete, r) for i, r in enumerate(REQUESTS)]
            for i, f in enumerate(futures):
                check(answer(f.result()) == reference[i], f"3 nodes: concurrent request {i} equals one node's")
        check_no_state(nodes, "3 nodes")
        text, error, out, pause = stream_through(nodes[0], LONG_SEEDED, lambda: nodes[2].process.send_signal(signal.SIGKILL))
        check(pause >= 0, f"the stream went on after the last stage was killed (the next token {pause:.2f} s later)")
        check(not error and text == seeded_reference,
              f"the last stage killed mid-stream: the whole text equals the fault-free run's ({text!r}) ...{out[-300:]}")
        stop_all(nodes)
    finally:
        os.unlink(MOE)
        os.rmdir(WORK)
    print(f"{len(FAILURES)} failed" if FAILURES else f"{SHAPE} cluster processes: all checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
