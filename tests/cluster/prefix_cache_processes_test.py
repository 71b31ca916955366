#!/usr/bin/env python3
"""The prefix cache through real `strata serve` processes, on 1 node and on 3: every answer
(text and logprobs) is the same with the cache on and off (--no-prefix-cache), for a repeated
request, a second chat turn that extends the first, 8 concurrent requests sharing a long system
prompt, a prompt exactly two blocks long, and a prefix evicted on one stage only; a repeated
request reports usage.prompt_tokens_details.cached_tokens > 0 with the cache on and 0 without;
GET /cluster shows each node's pool and its hits, misses and evictions.

usage: prefix_cache_processes_test.py STRATA MODEL.gguf
"""
import concurrent.futures
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_processes_test as base  # noqa: E402  (its Node and checks; its main does not run)

check = base.check

# The chat template takes much of the shared model's 128 positions: the prompts stay short.
SYSTEM = "You dream of robots and the moon."


def result(status_body):
    """What must not change (text, finish reason, logprobs) and the cached length."""
    status, body = status_body
    if status != 200:
        return ("error", status, json.dumps(body)), -1
    choice = body["choices"][0]
    content = choice["text"] if "text" in choice else choice["message"]["content"]
    return (content, choice["finish_reason"], choice.get("logprobs")), \
        body["usage"]["prompt_tokens_details"]["cached_tokens"]


def chat(messages, max_tokens=40):
    return {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "logprobs": True, "top_logprobs": 2}


def completion(prompt, max_tokens=24, **extra):
    return dict({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": 2}, **extra)


def two_blocks_prompt(node):
    """A prompt of exactly 32 tokens (two KV blocks), found by asking the server to count."""
    words = "Once upon a time"
    while True:
        status, body = node.post("/v1/completions", completion(words, 1))
        count = body["usage"]["prompt_tokens"] if status == 200 else 999
        if count == 32:
            return words
        if count > 32:
            raise RuntimeError(f"no prompt of 32 tokens near {words!r}")
        words += " a"


def kv_stats(node):
    return {n["id"]: n.get("kv_cache") for n in node.get("/cluster")[1]["nodes"]}


def own_kv_stats(nodes):
    """Each node's pool as it reports it itself (the others hear of it within a second)."""
    return {n.id: kv_stats(n)[n.id] for n in nodes}


def scenarios(nodes, boundary_prompt):
    """Every scenario's results at this cluster, in order, and the cached lengths seen."""
    entry = nodes[-1]
    out, cached = [], {}

    repeated = completion("Once upon a time, in a city of glass and silence, a small robot", 30)
    for label in ("first", "repeated"):
        r, c = result(entry.post("/v1/completions", repeated))
        out.append(r)
        cached["repeated " + label] = c
    text, usage = entry.stream("/v1/completions", repeated)
    out.append(text)
    cached["repeated streamed"] = usage["prompt_tokens_details"]["cached_tokens"]

    # The seed's scenario: each call separate, the second turn extending the first.
    turn1 = [{"role": "user", "content": "Write a brief history of the iPhone."}]
    r, c = result(entry.post("/v1/chat/completions", chat(turn1, 4)))
    out.append(r)
    turn2 = turn1 + [{"role": "assistant", "content": r[0]}, {"role": "user", "content": "Please continue."}]
    r, c = result(entry.post("/v1/chat/completions", chat(turn2, 4)))
    out.append(r)
    cached["second turn"] = c
    r, c = result(entry.post("/v1/chat/completions", chat([{"role": "user", "content": "Write about llamas."}])))
    out.append(r)
    r, c = result(entry.post("/v1/chat/completions", chat(turn1, 12)))
    out.append(r)
    cached["first turn again"] = c
    text, usage = entry.stream("/v1/chat/completions", chat(turn1, 12))
    out.append(text)
    cached["first turn streamed"] = usage["prompt_tokens_details"]["cached_tokens"]
    model = entry.get("/v1/models")[1]["data"][0]["id"]
    status, body = entry.post("/api/chat", {"model": model, "messages": turn1, "stream": False,
                                             "options": {"temperature": 0, "num_predict": 12}})
    out.append(body["message"]["content"] if status == 200 else ("error", status))
    # Ollama counts the prompt tokens it computed.
    cached["ollama uncounted"] = usage["prompt_tokens"] - body.get("prompt_eval_count", usage["prompt_tokens"])

    # 8 requests sharing a long system prompt, at once, each at another node, after one that
    # put the system prompt in the cache.
    shared = [chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}], 16)
              for q in ("Robots?", "The moon.", "Glass.", "Colours!", "A cat.", "Rain", "Silence", "Trains")]
    out.append(result(entry.post("/v1/chat/completions", chat([{"role": "system", "content": SYSTEM},
                                                                   {"role": "user", "content": "Hello"}], 16)))[0])
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(nodes[i % len(nodes)].post, "/v1/chat/completions", r) for i, r in enumerate(shared)]
        for i, f in enumerate(futures):
            r, c = result(f.result())
            out.append(r)
            cached[f"shared system prompt {i}"] = c

    boundary = completion(boundary_prompt, 20)
    for label in ("first", "repeated"):
        r, c = result(entry.post("/v1/completions", boundary))
        out.append(r)
        cached["two blocks " + label] = c
    return out, cached


def main():
    solo = base.start_cluster(["solo"], "--no-prefix-cache")
    boundary_prompt = two_blocks_prompt(solo[0])
    reference, _ = scenarios(solo, boundary_prompt)
    base.stop_all(solo)
    check(not any(isinstance(r, tuple) and r[0] == "error" for r in reference), f"one node answers: {reference}")

    for count in (1, 3):
        for flags in ((), ("--no-prefix-cache",)):
            label = f"{count} node(s){' ' + flags[0] if flags else ''}"
            nodes = base.start_cluster([f"p{i}" for i in range(count)], "--placement", "memory", *flags)
            got, cached = scenarios(nodes, boundary_prompt)
            for i, (g, want) in enumerate(zip(got, reference)):
                check(g == want, f"{label}: answer {i} equals one fresh node's without the cache: {g!r} vs {want!r}")
            if flags:
                check(all(c == 0 for c in cached.values()),
                      f"{label}: nothing is reported cached: {cached}")
            else:
                for key in ("repeated repeated", "repeated streamed", "second turn", "first turn again",
                            "first turn streamed", "ollama uncounted") + tuple(f"shared system prompt {i}" for i in range(8)):
                    check(cached[key] > 0, f"{label}: {key} reports cached tokens ({cached})")
                check(cached["two blocks repeated"] == 16, f"{label}: a 32-token prompt reuses one block ({cached})")
                stats = own_kv_stats(nodes)
                check(all(s and s["hits"] > 0 and s["used_blocks"] > 0 and s["pool_blocks"] > 0 for s in stats.values()),
                      f"{label}: /cluster shows every node's pool and its hits: {stats}")
                check(all(s is not None for s in kv_stats(nodes[0]).values()),
                      f"{label}: the leader's /cluster lists every node's pool: {kv_stats(nodes[0])}")
            base.check_no_state(nodes, label)
            base.stop_all(nodes)

    # The middle node's pool holds one context (8 blocks of f16, the default: mixing KV types
    # would change the answers): other requests evict the prefix there,
    # while the first and last nodes keep it.
    first = base.Node("e0", "--stages", "e0:0-1,e1:2-2,e2:3-3")
    nodes = [first,
             base.Node("e1", "--peers", first.address, "--stages", "e0:0-1,e1:2-2,e2:3-3", "--kv-memory", "32KiB"),
             base.Node("e2", "--peers", first.address, "--stages", "e0:0-1,e1:2-2,e2:3-3")]
    check(all(n.wait_healthy() for n in nodes), "the eviction cluster serves")
    request = completion("Once upon a time, in a city of glass and silence, a small robot", 30)
    want = reference[0]
    check(result(first.post("/v1/completions", request))[0] == want, "eviction cluster: the first answer")
    for prompt in ("The moon was made of old clocks and every clock", "Colours fell like rain on the sleeping town"):
        first.post("/v1/completions", completion(prompt, 80))
    stats = own_kv_stats(nodes)
    check(stats["e1"]["evictions"] > 0 and stats["e0"]["evictions"] == 0,
          f"eviction cluster: only the middle node evicted: {stats}")
    r, c = result(first.post("/v1/completions", request))
    check(r == want, f"eviction cluster: the answer after the middle node evicted its prefix: {r!r}")
    base.stop_all(nodes)

    print(f"{len(base.FAILURES)} failed" if base.FAILURES else "prefix cache processes: all checks passed")
    return 1 if base.FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
