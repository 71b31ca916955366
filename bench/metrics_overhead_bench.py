#!/usr/bin/env python3
"""What metrics and logging cost in decode speed, on one `strata serve` node through its HTTP API.

Decode: single-stream tokens/s with nobody scraping the node and with /metrics, /cluster and
/requests fetched every second (what the dashboard does), and optionally of a baseline binary
without metrics (another build, e.g. the commit before). Every binary has one node, started
once; the rounds go through the configurations in turn, in reverse order every other round
(the machine's speed drifts), each a streamed greedy completion of --tokens tokens whose decode
rate is (tokens - 1) / (last token's time - first token's time), and whose CPU time per token is
the server process's over the request (less moved than wall time by other processes). Printed
for both: each configuration's median and range, and the median and quartiles of the per-round
ratios to the first one (a round's configurations ran back to back, so a ratio is little moved
by the drift between rounds).

Scrapes (--scrape-cost N): the server process's CPU time (user + system, /proc) over N fetches
of each path back to back, less what it spends idle over as long, per fetch; and its CPU time
per second of decode: so what one fetch of each path a second costs as a share of decode's CPU.

  bench/metrics_overhead_bench.py --strata build/strata -m /tmp/tl-q4_0.gguf --rounds 40 --tokens 64 \\
      --scrape-cost 2000
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

DASHBOARD_PATHS = ("/metrics", "/cluster", "/requests")


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


def fetch(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        r.read()


def scrape_every_second(port, stop):
    """From the round's start on: a round shorter than a second is scraped too."""
    while True:
        for path in DASHBOARD_PATHS:
            fetch(port, path)
        if stop.wait(1.0):
            return


def cpu_seconds(pid):
    """User and system time of the process, all its threads (those ended too)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_over(pid, work):
    """(CPU seconds of the process, wall seconds) while `work` runs."""
    cpu, wall = cpu_seconds(pid), time.perf_counter()
    work()
    return cpu_seconds(pid) - cpu, time.perf_counter() - wall


def scrape_cost(pid, port, fetches, tokens):
    idle_cpu, idle_wall = cpu_over(pid, lambda: time.sleep(5))
    idle = idle_cpu / idle_wall
    per_fetch = {}
    for path in DASHBOARD_PATHS:
        cpu, wall = cpu_over(pid, lambda: [fetch(port, path) for _ in range(fetches)])
        per_fetch[path] = (cpu - idle * wall) / fetches
        print(f"{path:10s} {per_fetch[path] * 1e3:7.3f} ms CPU per fetch ({fetches} fetches in {wall:.1f} s, "
              f"{cpu:.2f} s CPU; idle {idle * 1e3:.1f} ms CPU/s)")
    cpu, wall = cpu_over(pid, lambda: decode_rate(port, tokens))
    decode = cpu / wall
    dashboard = sum(per_fetch.values())
    print(f"decode: {decode:.2f} CPU-seconds per second ({tokens} tokens in {wall:.1f} s)")
    print(f"/metrics once a second: {per_fetch['/metrics'] / decode * 100:.3f}% of decode's CPU; "
          f"all three paths: {dashboard / decode * 100:.3f}%")


def summarize(label, unit, rounds, firsts):
    """Median and range of `rounds`, and the median and quartiles of their ratios to the first
    configuration's rounds."""
    ratios = sorted(r / f for r, f in zip(rounds, firsts))
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    print(f"{label:34s} median {statistics.median(rounds):7.2f} {unit} (range {min(rounds):.2f}-{max(rounds):.2f}); "
          f"per-round ratio to the first: median {statistics.median(ratios):.4f}, "
          f"quartiles {quartiles[0]:.4f}-{quartiles[2]:.4f}")
    print(f"{'':34s} rounds: {' '.join(f'{r:.2f}' for r in rounds)}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strata", required=True)
    parser.add_argument("--baseline", help="a strata binary without metrics, to compare with")
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--scrape-cost", type=int, default=0, metavar="N",
                        help="also measure the CPU time of N fetches of each path")
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
        cpu_per_token = {label: [] for label, _, _ in configurations}
        for round_index in range(args.rounds):
            in_turn = configurations if round_index % 2 == 0 else configurations[::-1]
            for label, binary, scraped in in_turn:
                process, port = nodes[binary]
                stop = threading.Event()
                scraper = threading.Thread(target=scrape_every_second, args=(port, stop))
                if scraped:
                    scraper.start()
                cpu, _ = cpu_over(process.pid, lambda: rates[label].append(decode_rate(port, args.tokens)))
                cpu_per_token[label].append(cpu / args.tokens * 1e3)
                stop.set()
                if scraped:
                    scraper.join()
        first = configurations[0][0]
        for label, _, _ in configurations:
            summarize(label, "tokens/s", rates[label], rates[first])
            summarize("", "ms CPU per token (the server's, prefill and scrapes included)", cpu_per_token[label],
                      cpu_per_token[first])
        if args.scrape_cost:
            process, port = nodes[args.strata]
            scrape_cost(process.pid, port, args.scrape_cost, args.tokens)
    finally:
        for process, _ in nodes.values():
            process.terminate()
            process.wait()


if __name__ == "__main__":
    main()
