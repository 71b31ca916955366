#!/usr/bin/env python3
"""Speculative decoding through real `strata serve` processes, on 1 node and on 3: every answer
(text, finish reason, logprobs) is the same with prompt lookup, with a draft model (the model
itself, given to every node) and with --speculative off, greedy and seeded, one at a time and
6 at once at different nodes, streamed and not; usage says how many drafts the model accepted
and rejected (none with --speculative off), and the leader's /cluster counts them.

usage: speculative_processes_test.py STRATA MODEL.gguf
"""
import concurrent.futures
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_processes_test as base  # noqa: E402  (its Node and checks; its main does not run)

check = base.check

# The shared model repeats itself ("... Dimensions unfold, ..."): prompt lookup finds drafts.
PROMPTS = ["I dream of vectors. I dream of vectors. I dream of vectors. I dream of",
           "The cat sat on the mat. The cat sat on the mat. The cat",
           "Once upon a time, in a city of glass and silence, a small robot"]


def requests():
    out = []
    for i, prompt in enumerate(PROMPTS):
        out.append({"prompt": prompt, "max_tokens": 60, "temperature": 0, "logprobs": 2})
        out.append({"prompt": prompt, "max_tokens": 60, "temperature": 0.8, "seed": 40 + i, "logprobs": 1,
                    "frequency_penalty": 0.3})
    return out


def answers(nodes):
    """Each request's (text, finish reason, logprobs), alone and then all at once at different
    nodes, a streamed one's text, and the drafts accepted and rejected per request."""
    got, drafts = [], []
    for r in requests():
        status, body = nodes[-1].post("/v1/completions", r)
        check(status == 200, f"a completion is answered: {status} {body}")
        choice = body["choices"][0]
        got.append((choice["text"], choice["finish_reason"], choice["logprobs"]))
        details = body["usage"]["completion_tokens_details"]
        drafts.append((details["accepted_prediction_tokens"], details["rejected_prediction_tokens"]))
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(nodes[i % len(nodes)].post, "/v1/completions", r) for i, r in enumerate(requests())]
        for f in futures:
            status, body = f.result()
            choice = body["choices"][0] if status == 200 else {}
            got.append((choice.get("text"), choice.get("finish_reason"), choice.get("logprobs")))
    text, usage = nodes[0].stream("/v1/completions", requests()[0])
    got.append(text)
    drafts.append((usage["completion_tokens_details"]["accepted_prediction_tokens"],
                   usage["completion_tokens_details"]["rejected_prediction_tokens"]))
    return got, drafts


def main():
    strata, model = sys.argv[1], sys.argv[2]
    solo = base.start_cluster(["plain"], "--speculative", "off")
    reference, drafts = answers(solo)
    base.stop_all(solo)
    check(all(d == (0, 0) for d in drafts), f"--speculative off drafts nothing: {drafts}")

    for count in (1, 3):
        for flags in (("--speculative", "ngram"), ("--draft-model", model, "--draft-max", "4")):
            label = f"{count} node(s) {' '.join(flags[:2])}"
            nodes = base.start_cluster([f"s{i}" for i in range(count)], "--placement", "memory", *flags)
            got, drafts = answers(nodes)
            for i, (g, want) in enumerate(zip(got, reference)):
                check(g == want, f"{label}: answer {i} equals one node's without speculation: {g!r} vs {want!r}")
            check(sum(a for a, _ in drafts) > 0, f"{label}: usage reports accepted drafts: {drafts}")
            counts = nodes[0].get("/cluster")[1].get("speculative_decoding", {})
            check(counts.get("accepted_tokens", 0) > 0 and counts.get("drafted_tokens", 0) >= counts["accepted_tokens"],
                  f"{label}: the leader's /cluster counts drafts: {counts}")
            base.check_no_state(nodes, label)
            base.stop_all(nodes)

    print(f"{len(base.FAILURES)} failed" if base.FAILURES else "speculative processes: all checks passed")
    return 1 if base.FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
