#!/usr/bin/env python3
"""Embeddings across the pipeline: a synthetic Qwen3 embedding model (qwen3-embedding-tiny, last-token
pooling, Q8_0) served by real `strata serve` processes on 127.0.0.1. A cluster of three answers
/v1/embeddings (floats and base64) and /api/embed at every node with the bytes one node gives,
alone and concurrently beside completions; a model without a pooling type answers 400.

usage: embedding_cluster_processes_test.py STRATA DREAMS_MODEL
"""
import base64
import concurrent.futures
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

STRATA, DREAMS = sys.argv[1], sys.argv[2]
WORK = tempfile.mkdtemp(prefix="strata-embed-")
MODEL = os.path.join(WORK, "qwen3-embedding-tiny-q8_0.gguf")
subprocess.run([STRATA, "gguf", "synth", "--shape", "qwen3-embedding-tiny", "--type", "Q8_0", "-o", MODEL],
               check=True, capture_output=True)
sys.argv[2:] = [MODEL]  # the model every Node of cluster_processes_test starts with

from cluster_processes_test import FAILURES, Node, check, start_cluster, stop_all  # noqa: E402

TEXTS = ["the quick brown fox", "a cat sat on the mat", "embeddings of a whole text, " * 12,
         "short", "which node answers does not matter"]
REQUESTS = [("/v1/embeddings", {"input": TEXTS}),
            ("/v1/embeddings", {"input": TEXTS[2], "encoding_format": "base64"}),
            ("/v1/embeddings", {"input": [TEXTS[0], TEXTS[3]], "dimensions": 32}),
            ("/api/embed", {"input": TEXTS[1:4]})]


def post(node, path, body):
    request = urllib.request.Request(f"http://127.0.0.1:{node.port}{path}", data=json.dumps(body).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def comparable(path, raw):
    """The body without what differs between runs: Ollama's durations."""
    body = json.loads(raw)
    if path == "/api/embed":
        body.pop("total_duration", None)
    return json.dumps(body, sort_keys=True)


def check_vectors(raw):
    body = json.loads(raw)
    for item in body["data"]:
        vector = item["embedding"]
        if isinstance(vector, str):
            packed = base64.b64decode(vector)
            vector = struct.unpack(f"<{len(packed) // 4}f", packed)
        length = math.sqrt(sum(v * v for v in vector))
        check(abs(length - 1.0) < 1e-5, f"embedding {item['index']} has unit length ({length})")
        check(len(vector) == 128, f"embedding {item['index']} has the model's 128 dimensions ({len(vector)})")


def main():
    try:
        solo = start_cluster(["solo"])
        reference = []
        for path, body in REQUESTS:
            status, raw = post(solo[0], path, body)
            check(status == 200, f"one node answers {path} {body}: {raw[:300]}")
            reference.append(comparable(path, raw))
        check_vectors(post(solo[0], "/v1/embeddings", {"input": TEXTS})[1])
        completion = solo[0].complete({"prompt": "hello", "max_tokens": 12, "temperature": 0})
        stop_all(solo)

        nodes = start_cluster(["m0", "m1", "m2"], "--placement", "memory")
        for n in nodes:
            for i, (path, body) in enumerate(REQUESTS):
                status, raw = post(n, path, body)
                check(status == 200 and comparable(path, raw) == reference[i],
                      f"3 nodes: request {i} ({path}) at {n.id} gives one node's bytes")
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(post, nodes[i % 3], *REQUESTS[i % len(REQUESTS)]) for i in range(12)]
            completions = [pool.submit(n.complete, {"prompt": "hello", "max_tokens": 12, "temperature": 0})
                           for n in nodes]
            for i, f in enumerate(futures):
                path = REQUESTS[i % len(REQUESTS)][0]
                status, raw = f.result()
                check(status == 200 and comparable(path, raw) == reference[i % len(REQUESTS)],
                      f"3 nodes: concurrent request {i} ({path}) gives one node's bytes")
            for n, f in zip(nodes, completions):
                check(f.result()[1]["choices"][0]["text"] == completion[1]["choices"][0]["text"],
                      f"3 nodes: a completion at {n.id} beside embeddings is one node's")
        stop_all(nodes)

        generating = Node("gen", model=DREAMS)
        check(generating.wait_healthy(), "the dreams model is served")
        status, raw = post(generating, "/v1/embeddings", {"input": "hello"})
        check(status == 400 and b"no pooling type" in raw, f"a model without a pooling type: 400 ({status} {raw[:200]})")
        stop_all([generating])
    finally:
        os.unlink(MODEL)
        os.rmdir(WORK)
    print(f"{len(FAILURES)} failed" if FAILURES else "embedding cluster processes: all checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
