#!/usr/bin/env python3
"""Decode speed of a Strata cluster of local `strata serve` processes, end to end through the
HTTP API (streamed), as a user sees it.

  bench/cluster_bench.py --strata build/strata -m /tmp/tinyllama-q4_0.gguf

For each layout (nodes x threads per node) it starts the nodes on 127.0.0.1 with
--placement memory (so every node holds layers), waits until they serve, and measures:
- one stream's decode tokens/s: tokens after the first / time from the first to the last token;
- the aggregate decode tokens/s of N concurrent streams (every stream's tokens after its first,
  over the time from the first stream's first token to the last stream's last token).
Medians of --repeat runs, with the share of CPU time the host took (steal). The threads of all
nodes of a layout add up to the machine's cores in the default layouts, so that the layouts
compare at equal compute. A layout ending in "g"
(2x1g) makes its nodes one tensor-parallel group of every layer in equal shares
(--stages b0*1+b1*1:0-LAST); one ending in "s" (2x1s) leaves the placement to the speed
strategy (which forms groups over the links the nodes measure) and prints what it chose and
the time per token it predicted. With --alternate every layout runs at once and they take
turns, round by round, so that their ratios are of the same minutes:

  bench/cluster_bench.py -m /tmp/tinyllama-q4_0.gguf --alternate --layouts 1x1,2x1g,1x2 --streams 1
"""
import argparse
import concurrent.futures
import json
import re
import shlex
import statistics
import subprocess
import tempfile
import time
import urllib.request


def start(strata, model, node_id, threads, peers, ctx, parallel, extra=(), placement="memory"):
    log = tempfile.NamedTemporaryFile(prefix=f"bench-{node_id}-", suffix=".log", delete=False)
    args = [strata, "serve", "-m", model, "--port", "0", "--node-id", node_id, "-t", str(threads),
            "--placement", placement, "-c", str(ctx), "--parallel", str(parallel), *extra]
    if peers:
        args += ["--peers", peers]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
    port = node_port = None
    deadline = time.time() + 120
    while time.time() < deadline and (port is None or node_port is None):
        text = open(log.name, encoding="utf-8", errors="replace").read()
        if m := re.search(r"serving \S+ on http://127.0.0.1:(\d+)", text):
            port = int(m.group(1))
        if m := re.search(r"listens for nodes on [0-9.]+:(\d+)", text):
            node_port = int(m.group(1))
        time.sleep(0.05)
    if port is None:
        raise RuntimeError(f"{node_id} did not start:\n{open(log.name).read()}")
    return process, port, node_port


def wait_healthy(port, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.2)
    raise RuntimeError("the cluster did not become healthy")


def settled_placement(port, count, timeout=60):
    """The leader's placement once it knows all `count` nodes and has kept one epoch for 3 s: the
    first node serves alone until the others join and their links are measured."""
    deadline = time.time() + timeout
    epochs = []
    while time.time() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/cluster", timeout=10) as r:
            status = json.load(r)
        known = len(status["nodes"]) == count
        epochs = (epochs + [status["placement"]["epoch"]])[-4:] if known and status["serving"] else []
        if len(epochs) == 4 and len(set(epochs)) == 1:
            break
        time.sleep(1)
    return status["placement"]


def stream(port, prompt, max_tokens, seed, first_token=None):
    """Times of each streamed event with text (not of the one that opens the stream, which
    carries none), and the tokens generated; sets the threading.Event `first_token`, when given,
    at the first one. An event carries every token of a step: with speculative decoding, the
    drafts it confirmed too, so events are fewer than tokens."""
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "seed": seed,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    times = []
    tokens = None
    with urllib.request.urlopen(request, timeout=600) as r:
        for line in r:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            if event["choices"] and event["choices"][0]["text"]:
                times.append(time.perf_counter())
                if first_token is not None:
                    first_token.set()
    return times, tokens


def measure(port, streams, max_tokens, prompt=None):
    prompts = [prompt or f"Story number {i}: once upon a time" for i in range(streams)]
    with concurrent.futures.ThreadPoolExecutor(streams) as pool:
        results = list(pool.map(lambda i: stream(port, prompts[i], max_tokens, i), range(streams)))
    # The first event holds one token, the prompt's step's.
    decoded = sum(tokens - 1 for _, tokens in results)
    span = max(times[-1] for times, _ in results) - min(times[0] for times, _ in results)
    return decoded / span


def cpu_times():
    """The machine's CPU time so far, per kind, from /proc/stat (Linux)."""
    with open("/proc/stat", encoding="ascii") as f:
        return [int(x) for x in f.readline().split()[1:]]


def steal_share(before, after):
    """Of the time between two cpu_times(), the share the hypervisor gave to other guests: a
    virtual machine's runs are comparable only when it is small."""
    spent = [b - a for a, b in zip(before, after)]
    return spent[7] / max(1, sum(spent[:8]))


def layer_count(strata, model):
    inspected = subprocess.run([strata, "gguf", "inspect", model], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"\.block_count\s+\S+\s+(\d+)", inspected).group(1))


def start_layout(args, layout, prefix=""):
    """The nodes of `layout` (NODESxTHREADS[g|s]), started and serving, warmed up by a short request;
    node ids begin with `prefix`, so that several layouts can run side by side."""
    count, threads = (int(x) for x in layout.rstrip("gs").split("x"))
    extra = ()
    placement = "speed" if layout.endswith("s") else "memory"
    ids = [f"{prefix}b{i}" for i in range(count)]
    if layout.endswith("g"):
        last = layer_count(args.strata, args.model) - 1
        # Equal shares: the nodes are one machine's, whatever their probes found while the
        # others started.
        extra = ("--stages", "+".join(f"{node}*1" for node in ids) + f":0-{last}")
    extra += tuple(shlex.split(args.node_args))
    nodes = []
    try:
        first = start(args.strata, args.model, ids[0], threads, None, 512, 8, extra, placement)
        nodes.append(first)
        if not layout.endswith("g"):
            # The first node serves alone before the others start: a node probes its speed as
            # it starts, and one probing while the first loads its layers on the same cores
            # measured half its speed (shares of 68% and 32% where equal ones ran 1.4x faster).
            # A placement fixed by hand waits for every node it names before it serves.
            wait_healthy(first[1])
        for node in ids[1:]:
            nodes.append(start(args.strata, args.model, node, threads, f"127.0.0.1:{first[2]}", 512, 8, extra,
                               placement))
        wait_healthy(first[1])
        if placement == "speed":
            chosen = settled_placement(first[1], count)
            print(f"{layout}: {chosen['reason']}", flush=True)
        measure(first[1], 1, 8)  # warm-up
    except BaseException:
        stop(nodes)
        raise
    return nodes


def stop(nodes):
    for process, _, _ in nodes:
        process.terminate()
    for process, _, _ in nodes:
        process.wait()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strata", default="build/strata")
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("-n", "--tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--layouts", default="1x2,1x1,2x1,4x1",
                        help="NODESxTHREADS[g|s],... (g: one group; s: the speed placement's choice)")
    parser.add_argument("--streams", default="1,2,4,8", help="concurrent streams, measured on layouts of several nodes")
    parser.add_argument("--prompt", help="every stream's prompt (default: a story's start, numbered per stream)")
    parser.add_argument("--node-args", default="",
                        help="more arguments for every node, e.g. '--speculative off' (a node drafts by prompt lookup "
                             "unless told otherwise)")
    parser.add_argument("--alternate", action="store_true",
                        help="start every layout at once and measure them in turns, --repeat rounds of each stream "
                             "count, each round's speeds also as ratios to the first layout's: the layouts then meet "
                             "the same minutes of a machine whose speed drifts (the idle ones wait, using no core)")
    args = parser.parse_args()
    streams = [int(s) for s in args.streams.split(",")]
    layouts = args.layouts.split(",")
    if args.alternate:
        alternate(args, layouts, streams)
        return
    for layout in layouts:
        count, threads = (int(x) for x in layout.rstrip("gs").split("x"))
        nodes = start_layout(args, layout)
        try:
            port = nodes[0][1]
            for n in (streams if count > 1 else [1]):
                before = cpu_times()
                runs = [measure(port, n, args.tokens, args.prompt) for _ in range(args.repeat)]
                print(f"{count} node(s) x {threads} thread(s), {n} stream(s): "
                      f"{statistics.median(runs):6.1f} tokens/s decode (runs: {', '.join(f'{r:.1f}' for r in runs)}; "
                      f"{steal_share(before, cpu_times()):.0%} of the CPU time stolen by the host)", flush=True)
        finally:
            stop(nodes)


def alternate(args, layouts, streams):
    started = []
    try:
        for index, layout in enumerate(layouts):
            started.append(start_layout(args, layout, prefix=f"l{index}"))
        for n in streams:
            speeds = {layout: [] for layout in layouts}
            for round_number in range(args.repeat):
                before = cpu_times()
                for layout, nodes in zip(layouts, started):
                    speeds[layout].append(measure(nodes[0][1], n, args.tokens, args.prompt))
                first = speeds[layouts[0]][-1]
                print(f"{n} stream(s), round {round_number + 1}: " +
                      ", ".join(f"{layout} {speeds[layout][-1]:.1f}" for layout in layouts) + " tokens/s; x " +
                      layouts[0] + ": " + ", ".join(f"{layout} {speeds[layout][-1] / first:.2f}" for layout in layouts[1:]) +
                      f" ({steal_share(before, cpu_times()):.0%} stolen)", flush=True)
            print(f"{n} stream(s), medians: " +
                  ", ".join(f"{layout} {statistics.median(speeds[layout]):.1f}" for layout in layouts) +
                  " tokens/s; median ratios to " + layouts[0] + ": " +
                  ", ".join(f"{layout} {statistics.median(b / a for a, b in zip(speeds[layouts[0]], speeds[layout])):.2f}"
                            for layout in layouts[1:]), flush=True)
    finally:
        for nodes in started:
            stop(nodes)


if __name__ == "__main__":
    main()
