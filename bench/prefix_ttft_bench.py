#!/usr/bin/env python3
"""Time to first token with and without the prefix cache, through the HTTP API of 1 or more
local `strata serve` nodes, as a user sees it.

  bench/prefix_ttft_bench.py --strata build/strata -m /tmp/tl-q4_0.gguf --nodes 1,2

For each node count it starts the nodes (--placement memory, so every node holds layers) and,
--repeat times, sends a prompt of about --total tokens (cold: nothing of it is cached), then
another with the same first --cached tokens and a different rest, each a non-streamed
completion of one token, whose time is the time to first token. Medians are printed with the
`cached_tokens` the second request reported.
"""
import argparse
import json
import statistics
import sys
import time
import urllib.request

sys.path.insert(0, __import__("os").path.dirname(__file__))
from cluster_bench import start, wait_healthy  # noqa: E402

WORDS = ("river stone cloud amber lantern quiet meadow silver window garden thunder velvet candle "
         "harbor orchard marble feather winter copper violet").split()


def complete(port, prompt):
    body = json.dumps({"prompt": prompt, "max_tokens": 1, "temperature": 0}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=900) as r:
        usage = json.loads(r.read())["usage"]
    return time.perf_counter() - started, usage


def words(count, salt):
    return " ".join(WORDS[(i * 7 + salt * 13 + i // len(WORDS)) % len(WORDS)] for i in range(count))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strata", required=True)
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--nodes", default="1,2")
    parser.add_argument("--threads", type=int, default=2, help="threads of all nodes together")
    parser.add_argument("--total", type=int, default=1600)
    parser.add_argument("--cached", type=int, default=1500)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for count in (int(n) for n in args.nodes.split(",")):
        nodes = []
        peers = None
        for i in range(count):
            process, port, node_port = start(args.strata, args.model, f"t{i}", max(1, args.threads // count), peers,
                                             args.total + 64, 1)
            peers = peers or f"127.0.0.1:{node_port}"
            nodes.append((process, port))
        try:
            port = nodes[0][1]
            wait_healthy(port)
            # Tokens per word of this vocabulary, from a short prompt.
            _, usage = complete(port, words(100, 99))
            per_word = (usage["prompt_tokens"] - 1) / 100
            prefix_words = int(args.cached / per_word)
            rest_words = int((args.total - args.cached) / per_word)
            cold, warm, reused = [], [], []
            for r in range(args.repeat):
                prefix = f"Run {r}: " + words(prefix_words, r)
                seconds, _ = complete(port, prefix + " First, " + words(rest_words, 1))
                cold.append(seconds)
                seconds, usage = complete(port, prefix + " Second, " + words(rest_words, 2))
                warm.append(seconds)
                reused.append(usage["prompt_tokens_details"]["cached_tokens"])
            print(f"{count} node(s): prompt {usage['prompt_tokens']} tokens; time to first token cold "
                  f"{statistics.median(cold):.3f} s, with {statistics.median(reused)} cached "
                  f"{statistics.median(warm):.3f} s ({statistics.median(cold) / statistics.median(warm):.1f}x); "
                  f"runs cold {[round(s, 3) for s in cold]}, cached {[round(s, 3) for s in warm]}", flush=True)
        finally:
            for process, _ in nodes:
                process.terminate()
                process.wait()


if __name__ == "__main__":
    main()
