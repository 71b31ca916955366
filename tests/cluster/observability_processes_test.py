#!/usr/bin/env python3
"""GET /metrics of real `strata serve` processes: a 3-node cluster answers requests while it is
scraped, and afterwards the counters on the node they entered at have moved by exactly what its
answers' usage says (requests, prompt, cached and generated tokens) and the histograms by one
observation per request (per token for the inter-token latency); every scrape parses under the
text format's rules (written here from its specification), its histograms are well-formed, and
every node shows the three nodes up, the placement's layers, its own KV pool and stage, and the
leader its links to both peers. What links carry is counted at both ends, by peer and method:
the last node starts without a model file, and the weights (and their calls' bytes and
messages) its peers say they sent it are exactly what it says it received; every node's gossip
with every other moves both ways, and what one end received the other had sent. /requests at
the entry node tells each relayed request's wait in the leader's queue. /metrics is behind the
API key, or the metrics key when one is given. Logs: a request's x-request-id (the client's, or a new one) is on the line its entry
node writes about it and on the leader's lines about it once relayed there; the node started
with --log-format json writes nothing but JSON objects, the request's with its request_id.
`strata cluster --watch` in a tmux pane shows the three nodes and its figures, redrawn each second.

usage: observability_processes_test.py STRATA MODEL.gguf
"""
import json
import math
import time
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_processes_test as base  # noqa: E402  (its Node and checks; its main does not run)

check = base.check

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


def parse_value(text):
    if text in ("+Inf", "Inf"):
        return math.inf
    if text == "-Inf":
        return -math.inf
    if text == "NaN":
        return math.nan
    return float(text)


def parse_labels(text, pos):
    """The label set starting after '{' at `pos`; returns (labels, position after '}')."""
    labels = {}
    while True:
        if text[pos] == "}":
            return labels, pos + 1
        m = LABEL_NAME.match(text, pos)
        if not m:
            raise ValueError(f"bad label name at {text[pos:]!r}")
        name, pos = m.group(0), m.end()
        if text[pos:pos + 2] != '="':
            raise ValueError(f"label {name} without =\"")
        pos += 2
        value = ""
        while text[pos] != '"':
            if text[pos] == "\\":
                escaped = text[pos + 1]
                if escaped not in 'n"\\':
                    raise ValueError(f"bad escape \\{escaped}")
                value += "\n" if escaped == "n" else escaped
                pos += 2
            else:
                value += text[pos]
                pos += 1
        pos += 1
        if name in labels:
            raise ValueError(f"label {name} twice")
        labels[name] = value
        if text[pos] == ",":
            pos += 1
        elif text[pos] != "}":
            raise ValueError(f"bad label separator at {text[pos:]!r}")


def parse(text):
    """{family: {"type", "help", "samples": [(name, labels, value)]}}, raising ValueError on
    anything the text format (0.0.4) does not allow: a sample before its family's TYPE, a family
    split in two, a series twice, a malformed line."""
    families, current, series = {}, None, set()
    if text and not text.endswith("\n"):
        raise ValueError("the text does not end with a newline")
    for line in text.split("\n")[:-1]:
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            _, keyword, name, *rest = line.split(" ", 3)
            if not NAME.fullmatch(name):
                raise ValueError(f"bad metric name {name!r}")
            family = families.setdefault(name, {"type": None, "help": None, "samples": []})
            if current != name and family["samples"]:
                raise ValueError(f"family {name} is split")
            current = name
            if keyword == "TYPE":
                if family["type"] is not None or family["samples"] or rest[0] not in TYPES:
                    raise ValueError(f"bad TYPE line {line!r}")
                family["type"] = rest[0]
            else:
                family["help"] = rest[0] if rest else ""
            continue
        if line.startswith("#") or not line.strip():
            continue
        m = NAME.match(line)
        if not m:
            raise ValueError(f"bad sample line {line!r}")
        name, pos = m.group(0), m.end()
        labels = {}
        if line[pos] == "{":
            labels, pos = parse_labels(line, pos + 1)
        if line[pos] != " ":
            raise ValueError(f"no space before the value in {line!r}")
        value = parse_value(line[pos + 1:].split(" ")[0])
        family_name = current
        suffixes = ("_bucket", "_sum", "_count") if families[current]["type"] == "histogram" else ("",)
        if not any(name == family_name + s for s in suffixes):
            raise ValueError(f"sample {name} outside its family (under {current})")
        key = (name, tuple(sorted(labels.items())))
        if key in series:
            raise ValueError(f"series {key} twice")
        series.add(key)
        families[current]["samples"].append((name, labels, value))
    for name, family in families.items():
        if family["type"] is None:
            raise ValueError(f"family {name} has no TYPE")
        if family["type"] == "counter" and not name.endswith("_total"):
            raise ValueError(f"counter {name} does not end in _total")
        if family["type"] == "histogram":
            check_histogram(name, family["samples"])
    return families


def check_histogram(name, samples):
    """Per label set: buckets ascending in le, counts cumulative, +Inf last and equal to _count."""
    groups = {}
    for sample, labels, value in samples:
        key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
        group = groups.setdefault(key, {"buckets": [], "sum": None, "count": None})
        if sample.endswith("_bucket"):
            group["buckets"].append((parse_value(labels["le"]), value))
        elif sample.endswith("_sum"):
            group["sum"] = value
        else:
            group["count"] = value
    for key, g in groups.items():
        bounds = [b for b, _ in g["buckets"]]
        counts = [c for _, c in g["buckets"]]
        if not bounds or bounds[-1] != math.inf or bounds != sorted(bounds) or len(set(bounds)) != len(bounds):
            raise ValueError(f"{name}{key}: buckets {bounds}")
        if counts != sorted(counts) or counts[-1] != g["count"] or g["sum"] is None:
            raise ValueError(f"{name}{key}: counts {counts}, count {g['count']}, sum {g['sum']}")


def scrape(node, key=None):
    request = urllib.request.Request(f"http://127.0.0.1:{node.port}/metrics",
                                     headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, None, ""


def metrics_of(node):
    status, content_type, text = scrape(node)
    check(status == 200 and content_type.startswith("text/plain; version=0.0.4"),
          f"node {node.id}: /metrics answers {status} {content_type}")
    try:
        return parse(text)
    except (ValueError, IndexError, KeyError) as e:
        check(False, f"node {node.id}: /metrics parses ({e})")
        return {}


def family_of(families, name):
    """The family a sample name belongs to: a histogram's _bucket, _sum and _count are its own."""
    for suffix in ("_bucket", "_sum", "_count"):
        if name not in families and name.endswith(suffix):
            return name[:-len(suffix)]
    return name


def series(families, name):
    """Every (labels, value) of the samples named `name`."""
    return [(labels, v) for sample, labels, v in families.get(family_of(families, name), {}).get("samples", [])
            if sample == name]


def value(families, name, **labels):
    """The sample of `name` with these labels (0 when absent: a counter not yet moved)."""
    return next((v for l, v in series(families, name) if l == labels), 0.0)


def post(node, path, body):
    request = urllib.request.Request(f"http://127.0.0.1:{node.port}{path}", data=json.dumps(body).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.loads(r.read())


def stream_usage(node, body):
    body = dict(body, stream=True, stream_options={"include_usage": True})
    request = urllib.request.Request(f"http://127.0.0.1:{node.port}/v1/chat/completions",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    usage = None
    with urllib.request.urlopen(request, timeout=60) as r:
        for line in r:
            if line.startswith(b"data: {"):
                usage = json.loads(line[6:]).get("usage") or usage
    return usage


COUNTED = ("strata_prompt_tokens_total", "strata_prompt_cached_tokens_total", "strata_generation_tokens_total",
           "strata_time_to_first_token_seconds_count", "strata_e2e_request_latency_seconds_count",
           "strata_inter_token_latency_seconds_count")


def run_requests(entry, leader):
    """Requests at `entry` (one repeated, so that its prompt is cached; one streamed while
    /metrics is scraped at the leader); returns their usages and the scrapes made meanwhile."""
    usages, during = [], []
    repeated = {"prompt": "Once upon a time, in a city of glass and silence, a small robot", "max_tokens": 20,
                "temperature": 0}
    for body in (repeated, repeated, {"prompt": "The moon", "max_tokens": 7, "temperature": 0.8, "seed": 3}):
        usages.append(post(entry, "/v1/completions", body)["usage"])
    streamed = {}
    thread = threading.Thread(target=lambda: streamed.update(
        usage=stream_usage(entry, {"messages": [{"role": "user", "content": "Tell me a dream."}],
                                   "max_tokens": 60, "temperature": 0})))
    thread.start()
    while thread.is_alive():
        during.append(metrics_of(leader))
    thread.join()
    usages.append(streamed["usage"])
    return usages, during


def check_timelines(leader, entry):
    """GET /requests: the leader, whose scheduler runs the request, says how long it queued."""
    post(leader, "/v1/completions", {"prompt": "Silence", "max_tokens": 4, "temperature": 0})
    at_leader = leader.get("/requests")[1]["requests"][0]
    check(at_leader["finish"] == "length" and at_leader["generated_tokens"] == 4 and
          0 <= at_leader["queued_seconds"] <= at_leader["first_token_seconds"] <= at_leader["seconds"],
          f"the leader's timeline of its own request: {at_leader}")
    at_entry = entry.get("/requests")[1]["requests"]
    check(len(at_entry) == 4 and all(r["finish"] and r["queued_seconds"] is not None and
                                     0 <= r["queued_seconds"] <= r["first_token_seconds"] <= r["seconds"]
                                     for r in at_entry),
          f"the entry node's timelines of the requests it relayed, their wait in the leader's queue "
          f"included: {at_entry}")


def check_cluster_view(nodes, leader):
    for node in nodes:
        m = metrics_of(node)
        up = {labels["node"]: v for labels, v in series(m, "strata_node_up")}
        check(up == {"a": 1, "b": 1, "c": 1}, f"node {node.id}: strata_node_up {up}")
        layers = sorted((labels["layers"], v) for labels, v in series(m, "strata_placement_stage_layers"))
        check(sum(v for _, v in layers) == 4 and len(layers) == 3, f"node {node.id}: placement layers {layers}")
        blocks = {labels["state"]: v for labels, v in series(m, "strata_kv_blocks")}
        check(blocks.get("used", -1) + blocks.get("free", -1) == value(m, "strata_kv_pool_blocks") > 0,
              f"node {node.id}: KV blocks {blocks} of {value(m, 'strata_kv_pool_blocks')}")
        # A stage of an earlier placement (the node alone, before the others joined, when they
        # start slowly) may never have stepped; the current one has.
        own = {labels["layers"] for labels, _ in series(m, "strata_placement_stage_layers") if labels["node"] == node.id}
        steps = series(m, "strata_stage_step_seconds_count")
        current = [v for labels, v in steps if labels["layers"] in own]
        check(len(own) == 1 and len(current) == 1 and current[0] > 0, f"node {node.id}: stage steps {steps} of {own}")
        check(value(m, "strata_is_leader") == (1 if node is leader else 0), f"node {node.id}: strata_is_leader")
        check(value(m, "strata_placement_epoch") >= 1, f"node {node.id}: a placement epoch")
    m = metrics_of(leader)
    sent = link_counts(m, "sent_messages", "Forward")
    received = link_counts(m, "received_messages", "Forward")
    # A chain: the leader sends each batch to the first stage after its own, which passes it on
    # to the last, and the reply comes back the same way.
    check(len(sent) == 1 and sent == received and all(v > 0 for v in sent.values()),
          f"leader's batches go to one node: sent {sent}, replies {received}")
    first = next(iter(sent), None)
    rest = ({"a", "b", "c"} - {leader.id, first}).pop()
    on_first = metrics_of(next(n for n in nodes if n.id == first))
    passed = link_counts(on_first, "sent_messages", "Forward")
    passed_back = link_counts(on_first, "received_messages", "Forward")
    # (Its counts by the leader are of the calls it serves: the replies it sends, the batches it gets.)
    check(passed.get(rest) == passed_back.get(rest) == sent.get(first),
          f"node {first} passes each batch on to node {rest}: {passed}, replies {passed_back}")
    rtts = {labels["peer"]: v for labels, v in series(m, "strata_link_round_trip_seconds_count") if v > 0}
    check(rtts == sent, f"leader's link round trips {rtts} match its batches {sent}")
    byte_counts = link_counts(m, "sent_bytes", "Forward")
    check(all(v > 0 for v in byte_counts.values()), f"leader's batch bytes {byte_counts}")


def link_counts(families, what, rpc):
    """peer -> strata_link_{what}_total of calls of method `rpc`."""
    return {labels["peer"]: v for labels, v in series(families, f"strata_link_{what}_total") if labels.get("rpc") == rpc}


def check_links(nodes):
    """The node without a file fetched its weights from the others: each end's counts of those
    calls agree exactly. Gossip runs on, so one end's count lies between the other's before and
    after: received no more than was sent by then, and all but the last few messages sent before."""
    rounds = [{n.id: metrics_of(n) for n in nodes} for _ in range(3)]
    first, middle, last = rounds
    fetcher = nodes[2].id
    servers = [n.id for n in nodes[:2]]
    received = value(last[fetcher], "strata_weights_received_bytes_total")
    sent = {s: value(last[s], "strata_weights_sent_bytes_total") for s in servers}
    check(received > 0 and sum(sent.values()) == received,
          f"weights: node {fetcher} received {received} bytes, its peers sent {sent}")
    for method in ("ModelManifest", "FetchTensor"):
        for what, other in (("sent", "received"), ("received", "sent")):
            for unit in ("bytes", "messages"):
                served = {s: link_counts(last[s], f"{what}_{unit}", method).get(fetcher, 0) for s in servers}
                fetched = {s: v for s, v in link_counts(last[fetcher], f"{other}_{unit}", method).items()}
                # A manifest's request is empty: 0 bytes, in one message.
                moved = sum(served.values()) > 0 or (unit, what, method) == ("bytes", "received", "ModelManifest")
                check(moved and served == {s: fetched.get(s, 0) for s in servers},
                      f"{method} {unit}: {what} by {servers} to {fetcher} {served}, {other} there {fetched}")
    for x in nodes:
        for y in nodes:
            if x is y:
                continue
            for unit in ("messages", "bytes"):
                before = link_counts(first[x.id], f"sent_{unit}", "Hello").get(y.id, 0)
                got = link_counts(middle[y.id], f"received_{unit}", "Hello").get(x.id, 0)
                after = link_counts(last[x.id], f"sent_{unit}", "Hello").get(y.id, 0)
                # At most a call and a reply each way at once, of about the same size as the others.
                messages = link_counts(last[x.id], "sent_messages", "Hello").get(y.id, 1)
                in_flight = 3 if unit == "messages" else 3 * after / messages
                check(before > 0 and before - in_flight <= got <= after,
                      f"gossip {unit} from {x.id} to {y.id}: {before} sent, then {got} received, then {after} sent")


def check_keys():
    keyed = base.Node("k", "--api-key", "api-secret")
    try:
        check(keyed.wait_healthy(), "a node with an API key is healthy")
        check(scrape(keyed)[0] == 401, "/metrics without the API key: 401")
        status, _, text = scrape(keyed, "api-secret")
        check(status == 200 and "strata_node_up" in text, f"/metrics with the API key: {status}")
    finally:
        keyed.stop()
    split = base.Node("m", "--api-key", "api-secret", "--metrics-key", "scrape-secret")
    try:
        check(split.wait_healthy(), "a node with a metrics key is healthy")
        check(scrape(split, "api-secret")[0] == 401, "/metrics with the API key when a metrics key is set: 401")
        check(scrape(split, "scrape-secret")[0] == 200, "/metrics with the metrics key: 200")
    finally:
        split.stop()


def start_cluster(cache):
    """As base.start_cluster, with the last node logging JSON, and fetching its weights from its
    peers into `cache`."""
    extra = ["--placement", "memory", "--test-link-delay-ms", "5"]
    first = base.Node("a", *extra)
    nodes = [first, base.Node("b", "--peers", first.address, *extra),
             base.Node("c", "--peers", first.address, "--log-format", "json", "--cache-dir", cache, *extra,
                       model=None)]
    for n in nodes:
        check(n.wait_healthy(), f"node {n.id} became healthy")
    deadline = time.time() + 30
    while time.time() < deadline and not base.settled(first.get("/cluster")[1], 3):
        time.sleep(0.2)
    check(base.settled(first.get("/cluster")[1], 3), "the placement uses every node")
    return nodes


def check_logs(leader, entry):
    body = json.dumps({"prompt": "The robot", "max_tokens": 5, "temperature": 0}).encode()
    for given in ("trace-7", None):
        request = urllib.request.Request(f"http://127.0.0.1:{entry.port}/v1/completions", data=body, method="POST",
                                         headers=dict({"Content-Type": "application/json"},
                                                      **({"x-request-id": given} if given else {})))
        with urllib.request.urlopen(request, timeout=60) as r:
            answered = r.headers.get("x-request-id")
        if given:
            check(answered == given, f"the client's x-request-id comes back ({answered})")
        else:
            check(re.fullmatch(r"[0-9a-f]{16}", answered or "") is not None, f"a new request id ({answered})")
    deadline = time.time() + 5
    while time.time() < deadline and f"request {answered}: the scheduler here finished it" not in leader.text():
        time.sleep(0.1)
    for request_id in ("trace-7", answered):
        lines = [l for l in leader.text().splitlines() if f"request {request_id}: " in l]
        check(any("node c relayed it" in l for l in lines) and any("finished it (length)" in l for l in lines),
              f"the leader's lines about {request_id}: {lines}")
    records = []
    for line in entry.text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            check(False, f"node c, --log-format json, wrote a line that is no JSON: {line!r}")
    check(all({"time", "level", "node", "message"} <= set(r) for r in records) and records,
          f"node c's {len(records)} JSON lines have time, level, node and message")
    ended = [r for r in records if r.get("request_id") == "trace-7"]
    check(len(ended) == 1 and "generation ended (length)" in ended[0]["message"] and ended[0]["level"] == "info",
          f"node c's line about trace-7: {ended}")


def check_watch(entry):
    """`strata cluster --watch` in a detached tmux session of a private tmux server."""
    tmux = ["tmux", "-L", f"strata-watch-{os.getpid()}"]
    subprocess.run(tmux + ["new-session", "-d", "-x", "160", "-y", "40",
                           f"{os.path.abspath(base.STRATA)} cluster --port {entry.port} --watch"], check=True)
    try:
        screens = []
        for _ in range(3):
            time.sleep(1.5)
            screens.append(subprocess.run(tmux + ["capture-pane", "-p"], capture_output=True, text=True).stdout)
        last = screens[-1]
        rows = [l.split()[0] for l in last.splitlines() if l.split() and l.split()[0] in ("a", "b", "c")]
        check(sorted(rows) == ["a", "b", "c"], f"--watch shows the three nodes once each:\n{last}")
        check("tokens/s here" in last and "KV " in last, f"--watch shows the live figures:\n{last}")
        clocks = [next((l for l in s.splitlines() if l.startswith("strata cluster at")), "") for s in screens]
        check(len(set(clocks)) == 3, f"--watch redraws each second: {clocks}")
        check(last.count("strata cluster at") == 1, "--watch draws over its last frame, not below it")
    finally:
        subprocess.run(tmux + ["kill-server"], capture_output=True)


def main():
    cache = tempfile.mkdtemp(prefix="strata-observability-")
    nodes = start_cluster(cache)
    try:
        leader, entry = nodes[0], nodes[2]
        before = metrics_of(entry)
        usages, during = run_requests(entry, leader)
        after = metrics_of(entry)
        check(len(during) >= 1, f"{len(during)} scrapes during a stream")
        check(any(value(m, "strata_requests_running") >= 1 for m in during),
              "the leader's strata_requests_running shows the stream while it runs")

        def moved(name, **labels):
            return value(after, name, **labels) - value(before, name, **labels)

        sent = {
            "strata_prompt_tokens_total": sum(u["prompt_tokens"] for u in usages),
            "strata_prompt_cached_tokens_total": sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages),
            "strata_generation_tokens_total": sum(u["completion_tokens"] for u in usages),
            "strata_time_to_first_token_seconds_count": len(usages),
            "strata_e2e_request_latency_seconds_count": len(usages),
            "strata_inter_token_latency_seconds_count": sum(u["completion_tokens"] - 1 for u in usages),
        }
        check(sent["strata_prompt_cached_tokens_total"] > 0, f"the repeated prompt was cached ({usages})")
        for name in COUNTED:
            check(moved(name) == sent[name], f"{name} moved by {moved(name)}, the answers say {sent[name]}")
        check(moved("strata_http_requests_total", endpoint="/v1/completions", status="200") == 3,
              "strata_http_requests_total{endpoint=/v1/completions,status=200} moved by 3")
        check(moved("strata_http_requests_total", endpoint="/v1/chat/completions", status="200") == 1,
              "strata_http_requests_total{endpoint=/v1/chat/completions,status=200} moved by 1")
        check(moved("strata_request_finished_total", reason="length") +
              moved("strata_request_finished_total", reason="stop") == 4, "4 generations finished")
        check(moved("strata_e2e_request_latency_seconds_sum") > 0, "end-to-end latencies add up to more than 0")
        check_cluster_view(nodes, leader)
        check_links(nodes)
        check_timelines(leader, entry)
        check_logs(leader, entry)
        check_watch(entry)
    finally:
        base.stop_all(nodes)
        shutil.rmtree(cache, ignore_errors=True)
    check_keys()
    print("FAILED" if base.FAILURES else "OK", flush=True)
    return 1 if base.FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
