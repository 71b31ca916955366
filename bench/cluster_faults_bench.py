#!/usr/bin/env python3
"""How long streams pause when a node of a local cluster is lost or leaves, end to end through
the HTTP API, as a user sees it.

  bench/cluster_faults_bench.py --strata build/strata -m /tmp/tl-q4_0.gguf

Each round starts three `strata serve` processes on 127.0.0.1 (one thread each, --placement
memory, so that every node holds layers), runs --streams concurrent greedy streams whose prompts
are about --prompt-tokens long, and --after seconds after their first tokens either SIGKILLs the last stage
(`loss`: the others notice, place the model anew, and compute the requests again) or runs
`strata drain` on it (`drain`: the state of the sequences moves to the nodes that take its
layers over), or on the leader (`leader-drain`: it goes on until the next leader serves, then
passes its requests on, and their state moves to the new stages), or nothing (`none`: the gaps
of an ordinary run, to compare with). It prints, per round, the time from the event to the next token of any stream and
the longest gap between two tokens of a stream across the event, then the medians; and for a
drain, the (new) leader's count of sequences handed over and computed again.
"""
import argparse
import concurrent.futures
import json
import signal
import statistics
import subprocess
import threading
import time
import urllib.request

from cluster_bench import start, stop, stream, wait_healthy


def cluster_status(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/cluster", timeout=10) as r:
        return json.loads(r.read())


def one_round(args, event):
    nodes = []
    try:
        extra = ("--test-link-delay-ms", str(args.link_delay_ms)) if args.link_delay_ms else ()
        first = start(args.strata, args.model, "f0", 1, None, args.ctx, 8, extra)
        nodes.append(first)
        for i in (1, 2):
            nodes.append(start(args.strata, args.model, f"f{i}", 1, f"127.0.0.1:{first[2]}", args.ctx, 8, extra))
        wait_healthy(first[1])
        stages = [s["node"] for s in cluster_status(first[1])["placement"]["stages"]]
        victim = first if event == "leader-drain" else nodes[int(stages[-1][1:])]
        entry = first if victim is not first else nodes[1]
        # Words of a story, one token or two each: the prompt's length in tokens is about this.
        prompts = [" ".join(["once upon a time"] * (args.prompt_tokens // 4)) + f" story {i}" for i in range(args.streams)]
        firsts = [threading.Event() for _ in prompts]
        with concurrent.futures.ThreadPoolExecutor(args.streams) as pool:
            futures = [pool.submit(stream, entry[1], p, args.tokens, i, firsts[i]) for i, p in enumerate(prompts)]
            for first_token in firsts:
                first_token.wait(timeout=600)
            time.sleep(args.after)
            event_at = time.perf_counter()
            if event == "loss":
                victim[0].send_signal(signal.SIGKILL)
            elif event != "none":
                subprocess.Popen([args.strata, "drain", "--port", str(victim[1])], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            results = [f.result()[0] for f in futures]
        next_token = min((t for times in results for t in times if t > event_at), default=float("nan")) - event_at
        longest_gap = max(max((b - a for a, b in zip(times, times[1:]) if b > event_at), default=0.0)
                          for times in results)
        switches = cluster_status(entry[1]).get("placement_switches", {})
        return next_token, longest_gap, switches
    finally:
        stop(nodes)  # a killed node's terminate() does nothing


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strata", default="build/strata")
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--events", default="loss,drain")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("-n", "--tokens", type=int, default=48)
    parser.add_argument("--ctx", type=int, default=512)
    parser.add_argument("--after", type=float, default=1.0, help="seconds of decoding before the event")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--link-delay-ms", type=int, default=0,
                        help="latency added to each call between stages (--test-link-delay-ms), so that a small "
                             "model's streams last long enough for the event")
    args = parser.parse_args()
    for event in args.events.split(","):
        rounds = []
        for r in range(args.repeat):
            next_token, gap, switches = one_round(args, event)
            rounds.append((next_token, gap))
            print(f"{event} round {r + 1}: next token {next_token:.2f} s after the event, longest gap of a stream "
                  f"{gap:.2f} s; {switches}", flush=True)
        print(f"{event}: median next token {statistics.median(n for n, _ in rounds):.2f} s, median longest gap "
              f"{statistics.median(g for _, g in rounds):.2f} s", flush=True)


if __name__ == "__main__":
    main()
