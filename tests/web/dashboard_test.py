#!/usr/bin/env python3
"""The dashboard in a real browser: starts a 3-node cluster behind an API key and runs
dashboard_test.mjs (Debian's chromium driven by puppeteer-core) against the last node's page.

usage: dashboard_test.py STRATA MODEL.gguf SCREENSHOT_DIR
"""
import json
import os
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
import cluster_processes_test as base  # noqa: E402  (its Node and checks; its main does not run)

KEY = "dashboard-secret"


def cluster_status(node):
    request = urllib.request.Request(f"http://127.0.0.1:{node.port}/cluster",
                                     headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=10) as r:
        return json.loads(r.read())


def start_keyed_cluster(ids):
    """As base.start_cluster, with /cluster read with the key."""
    extra = ["--placement", "memory", "--api-key", KEY]
    first = base.Node(ids[0], *extra)
    nodes = [first] + [base.Node(i, "--peers", first.address, *extra) for i in ids[1:]]
    for n in nodes:
        base.check(n.wait_healthy(), f"node {n.id} became healthy")
    deadline = time.time() + 30
    while time.time() < deadline and not base.settled(cluster_status(first), len(ids)):
        time.sleep(0.2)
    base.check(base.settled(cluster_status(first), len(ids)), "the placement uses every node")
    return nodes


def main():
    screenshots = sys.argv[3]
    nodes = start_keyed_cluster(["a", "b", "c"])
    try:
        placement = cluster_status(nodes[0])["placement"]["stages"]
        layers = " ".join(f"{s['first_layer']}-{s['last_layer'] - 1}" for s in placement)
        victim = nodes[1]
        env = dict(os.environ, STRATA_URL=f"http://127.0.0.1:{nodes[2].port}/", STRATA_API_KEY=KEY,
                   STRATA_KILL_PID=str(victim.process.pid), STRATA_KILL_ID=victim.id, STRATA_LAYERS=layers,
                   STRATA_SCREENSHOTS=screenshots)
        code = subprocess.run(["node", os.path.join(HERE, "dashboard_test.mjs")], env=env, timeout=240).returncode
        base.check(code == 0, "the browser test passed")
    finally:
        base.stop_all(nodes)
    print("FAILED" if base.FAILURES else "OK", flush=True)
    return 1 if base.FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
