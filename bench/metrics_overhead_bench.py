#!/usr/bin/env python3
"""What metrics and logging cost in decode speed: single-stream decode tokens/s through the HTTP
API of one `strata serve` node, with nobody scraping it and with /metrics, /cluster and
/requests fetched every second (what the dashboard does), and optionally of a baseline binary
without them (another build, e.g. the commit before).

  bench/metrics_overhead_bench.py --strata build/strata --baseline /tmp/strata-before -m /tmp/tl-q4_0.gguf

Every configuration has its own node, started once; rounds go through the configurations in
turn (the machine's speed drifts), each a streamed greedy completion of --tokens tokens whose
decode rate is (tokens - 1) / (last token's time - first token's time). Medians are printed.
"""
import argparse
import json
import os
import statistics
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from cluster_bench import start, wait_healthy  # noqa: E402


def decode_rate(port, tokens):
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": tokens, "temperature": 0, "stream": True}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    times = []
    with urllib.request.urlopen(request, timeout=900) as r:
        for line in r:
            if line.startswith(b"data: {"):
                times.append(time.perf_counter())
    return (len(times) - 1) / (times[-1] - times[0])


def scrape_every_second(port, stop):
    while not stop.wait(1.0):
        for path in ("/metrics", "/cluster", "/requests"):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
                r.read()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strata", required=True)
    parser.add_argument("--baseline", help="a strata binary without metrics, to compare with")
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    configurations = [("metrics on, not scraped", args.strata, False),
                      ("metrics on, scraped every second", args.strata, True)]
    if args.baseline:
        configurations.insert(0, ("baseline binary", args.baseline, False))
    nodes = {}
    try:
        for i, (label, binary, _) in enumerate(configurations):
            if binary not in nodes:
                process, port, _ = start(binary, args.model, f"overhead{i}", args.threads, None, 512, 1)
                wait_healthy(port)
                decode_rate(port, 16)  # warm-up
                nodes[binary] = (process, port)
        rates = {label: [] for label, _, _ in configurations}
        for _ in range(args.rounds):
            for label, binary, scraped in configurations:
                port = nodes[binary][1]
                stop = threading.Event()
                scraper = threading.Thread(target=scrape_every_second, args=(port, stop))
                if scraped:
                    scraper.start()
                rates[label].append(decode_rate(port, args.tokens))
                stop.set()
                if scraped:
                    scraper.join()
        base = statistics.median(rates[configurations[0][0]])
        for label, _, _ in configurations:
            median = statistics.median(rates[label])
            print(f"{label:34s} median {median:7.2f} tokens/s ({median / base * 100 - 100:+.1f}%)  "
                  f"rounds: {' '.join(f'{r:.2f}' for r in rates[label])}")
    finally:
        for process, _ in nodes.values():
            process.terminate()
            process.wait()


if __name__ == "__main__":
    main()
