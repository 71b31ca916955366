#!/usr/bin/env python3
"""Tensor-parallel groups served by real `strata serve` processes on 127.0.0.1: a stage computed
by a group of nodes, each a share of every layer (`--stages a+b:0-3`, shares by the members'
speeds, or `a*3+b:0-3`, by weight), answers every greedy and seeded request (text and logprobs)
at every node as one node does, alone and concurrently: a group of 2 holding the whole model, an
uneven group of 2 between two single stages (the first passing each batch on to the group
itself, a chain), and an uneven group of 3; on the shared model and on a Mixture-of-Experts one
(`strata gguf synth --shape qwen3moe-tiny`, its group given batches by the leader as a chain's).
/cluster shows each group's members and shares; a member killed mid-stream leaves the whole text
one node's, in a group with the leader and in one the leader sends batches to. Without a
placement by hand, nodes whose reads cost more than their links' gathers measure those links and
the speed placement makes them a group.

usage: group_processes_test.py STRATA MODEL.gguf
"""
import concurrent.futures
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_processes_test as base  # noqa: E402  (its Node and checks; its main does not run)

check = base.check


def start(stages, ids, model, *extra):
    """Nodes `ids` with the placement `stages` fixed by hand, the others naming the first."""
    first = base.Node(ids[0], "--stages", stages, *extra, model=model)
    nodes = [first] + [base.Node(i, "--peers", first.address, "--stages", stages, *extra, model=model) for i in ids[1:]]
    deadline = time.time() + 60
    while time.time() < deadline:
        status = first.get("/cluster")[1]
        placement = status.get("placement", {})
        ready = {n["id"]: n["ready_epoch"] for n in status.get("nodes", [])}
        members = [m["node"] for s in placement.get("stages", []) for m in s.get("group", [{"node": s["node"]}])]
        if status.get("serving") and sorted(members) == sorted(ids) and all(
                ready.get(m) == placement["epoch"] for m in members):
            break
        time.sleep(0.2)
    check(all(n.wait_healthy() for n in nodes), f"{stages}: every node is healthy")
    return nodes


def requests():
    out = [dict(r, max_tokens=16) for r in base.REQUESTS]
    out.append({"prompt": "The robot", "max_tokens": 40, "temperature": 0, "logprobs": 3})
    return out


def run_layout(stages, ids, model, reference):
    nodes = start(stages, ids, model)
    try:
        placement = nodes[0].get("/cluster")[1]["placement"]
        groups = [s["group"] for s in placement["stages"] if "group" in s]
        check(groups and all(abs(sum(m["share"] for m in g) - 1) < 1e-9 for g in groups),
              f"{stages}: /cluster shows the groups and their shares ({placement['stages']})")
        for n in nodes:
            for i, r in enumerate(requests()[:3]):
                got = base.answer(n.complete(r))
                check(got == reference[i], f"{stages}: request {i} at {n.id} equals one node's ({got[0]!r})")
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(nodes[i % len(nodes)].complete, r) for i, r in enumerate(requests())]
            for i, f in enumerate(futures):
                check(base.answer(f.result()) == reference[i], f"{stages}: concurrent request {i} equals one node's")
        base.check_no_state(nodes, stages)
        # Every member computed its share of the requests' inputs.
        for n in nodes:
            own = next(m for m in n.get("/cluster")[1]["nodes"] if m["self"])
            check(own["stage_inputs"] > 0, f"{stages}: {n.id} computed inputs ({own['stage_inputs']})")
            if n.id in [m["node"] for g in groups for m in g]:
                check("as member" in n.text(), f"{stages}: {n.id} loaded its share as a group member")
    finally:
        if base.FAILURES:
            for n in nodes:
                print(f"--- {n.id}\n{n.text()[-3000:]}")
        base.stop_all(nodes)


def check_model(model, layouts, speed_chooses=None):
    solo = base.start_cluster(["solo"]) if model == base.MODEL else [base.Node("solo", model=model)]
    solo[0].wait_healthy()
    reference = [base.answer(solo[0].complete(r)) for r in requests()]
    long_reference = solo[0].complete(base.LONG_SEEDED)[1]["choices"][0]["text"]
    base.stop_all(solo)
    check(all(r[0] != "error" for r in reference), f"the single node answers: {reference}")
    for stages, ids in layouts:
        run_layout(stages, ids, model, reference)
    if speed_chooses:
        chosen_by_the_speed_placement(speed_chooses, model, reference)
    return long_reference


def chosen_by_the_speed_placement(ids, model, reference):
    """No placement by hand: nodes that each read weights at 10 MB/s (so that reading, not the
    links, is what a token costs) measure their links, and the leader's speed placement makes them
    one group, saying why; every answer is one node's."""
    first = base.Node(ids[0], "--test-weight-speed", "1e7", model=model)
    nodes = [first] + [base.Node(i, "--peers", first.address, "--test-weight-speed", "1e7", model=model)
                       for i in ids[1:]]
    try:
        check(all(n.wait_healthy() for n in nodes), "speed placement: every node is healthy")
        status = first.get("/cluster")[1]
        placement = status["placement"]
        groups = [s["group"] for s in placement["stages"] if "group" in s]
        check(len(groups) == 1 and sorted(m["node"] for m in groups[0]) == sorted(ids),
              f"speed placement: one group of {ids} ({placement['stages']})")
        check("the nodes alone" in placement["reason"], f"speed placement: it says why ({placement['reason']!r})")
        for n in status["nodes"]:
            peers = sorted(link["peer"] for link in n["links"])
            check(peers == sorted(i for i in ids if i != n["id"]) and all(
                link["latency_seconds"] > 0 and link["bytes_per_second"] > 0 for link in n["links"]),
                f"speed placement: {n['id']} measured its links ({n['links']})")
        for n in nodes:
            for i, r in enumerate(requests()[:3]):
                got = base.answer(n.complete(r))
                check(got == reference[i], f"speed placement: request {i} at {n.id} equals one node's ({got[0]!r})")
    finally:
        if base.FAILURES:
            for n in nodes:
                print(f"--- {n.id}\n{n.text()[-3000:]}")
        base.stop_all(nodes)


def member_killed_mid_stream(stages, ids, victim, model, reference):
    """A stream through a group whose member `victim` is killed a second in: the members left
    compute the group's layers (the placement repaired) and the whole text is the fault-free one."""
    # 20 ms a stage call, as a LAN's: the stream is still going when the member is killed.
    nodes = start(stages, ids, model, "--test-link-delay-ms", "20")
    try:
        killed = next(n for n in nodes if n.id == victim)
        text, error, out = base.stream_through_a_kill(nodes[0], killed, base.LONG_SEEDED)
        check(not error and text == reference,
              f"{stages}, {victim} killed mid-stream: the whole text equals one node's ({text!r}) ...{out[-300:]}")
        stages_after = nodes[0].get("/cluster")[1]["placement"]["stages"]
        check(all(victim not in [m["node"] for m in s.get("group", [{"node": s["node"]}])] for s in stages_after),
              f"{stages}: the placement after the loss leaves {victim} out ({stages_after})")
    finally:
        if base.FAILURES:
            for n in nodes:
                print(f"--- {n.id}\n{n.text()[-3000:]}")
        base.stop_all(nodes)


def member_drained_mid_stream(stages, ids, leaving, model, reference):
    """`strata drain` on group member `leaving` a second into a stream: the members left take the
    group's keys and values over (handed over, not computed again) and the text is one node's."""
    nodes = start(stages, ids, model, "--test-link-delay-ms", "20")
    try:
        base.drain_mid_stream(f"{stages}, {leaving} drained", nodes[0], next(n for n in nodes if n.id == leaving),
                              nodes[0], reference)
    finally:
        if base.FAILURES:
            for n in nodes:
                print(f"--- {n.id}\n{n.text()[-3000:]}")
        base.stop_all(nodes)


def main():
    # g0 leads: in the second layout g1 passes each batch on to the group g2+g3 itself (a chain).
    long_reference = check_model(base.MODEL, [("g0+g1:0-3", ["g0", "g1"]),
                                              ("g1:0-0,g2*3+g3:1-2,g0:3-3", ["g0", "g1", "g2", "g3"]),
                                              ("g0+g1*2+g2:0-3", ["g0", "g1", "g2"])],
                                 speed_chooses=["s0", "s1", "s2"])
    member_killed_mid_stream("k0+k1+k2:0-3", ["k0", "k1", "k2"], "k1", base.MODEL, long_reference)
    # The leader k0 sends each batch to the group k1+k2+k3 as a chain's, every member at once.
    member_killed_mid_stream("k0:0-0,k1+k2+k3:1-3", ["k0", "k1", "k2", "k3"], "k2", base.MODEL, long_reference)
    member_drained_mid_stream("d0+d1+d2:0-1,d3:2-3", ["d0", "d1", "d2", "d3"], "d2", base.MODEL, long_reference)
    work = tempfile.mkdtemp(prefix="strata-group-")
    moe = os.path.join(work, "qwen3moe-tiny-q8_0.gguf")
    try:
        subprocess.run([base.STRATA, "gguf", "synth", "--shape", "qwen3moe-tiny", "--type", "Q8_0", "-o", moe],
                       check=True, capture_output=True)
        check_model(moe, [("m1*1+m2*3:0-1,m0:2-3", ["m0", "m1", "m2"])])
    finally:
        if os.path.exists(moe):
            os.unlink(moe)
        os.rmdir(work)
    print(f"{len(base.FAILURES)} failed" if base.FAILURES else "group processes: all checks passed")
    return 1 if base.FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
