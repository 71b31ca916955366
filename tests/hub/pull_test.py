#!/usr/bin/env python3
"""`strata pull` and `-m OWNER/REPO` against a local stand-in for the Hugging Face hub
(fake_hub.py) serving the shared model: a pulled file is byte-identical and runs; a download
broken off half-way resumes with a Range request from the partial file's size, also in a later
run, and starts over when the server ignores Range; wrong bytes are refused and the partial file
kept; HF_TOKEN is sent; a repo without FILE gets its GGUF; progress is printed, as lines or as a
bar on a terminal; two pulls of one file download it once.

usage: pull_test.py STRATA MODEL.gguf
"""
import os
import pty
import shutil
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fake_hub import FakeHub  # noqa: E402

STRATA, MODEL = sys.argv[1], sys.argv[2]
FAILURES = []
with open(MODEL, "rb") as f:
    DREAMS = f.read()
OTHER = DREAMS[::-1]  # any other bytes, for the files a test must not get
NAME = "aidreams260K.gguf"
TOKEN = "hf_test_token_123"


def check(condition, message, detail=""):
    if not condition:
        FAILURES.append(message)
        print("FAIL " + message + ("\n" + detail if detail else ""), flush=True)
    return condition


def strata(hub, *args, env=None, cache=None):
    environment = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_ENDPOINT", "STRATA_CACHE")}
    environment["HF_ENDPOINT"] = hub.endpoint
    if cache:
        environment["STRATA_CACHE"] = cache
    environment.update(env or {})
    return subprocess.run([STRATA, *args], capture_output=True, text=True, env=environment, timeout=120)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def cdn_gets(hub, since=0):
    return [r for r in hub.requests("/cdn/")[since:] if r["method"] == "GET"]


def test_pull_and_run(hub, cache):
    r = strata(hub, "pull", f"tester/dreams-GGUF:{NAME}", "--cache-dir", cache)
    path = os.path.join(cache, "tester", "dreams-GGUF", NAME)
    if not check(r.returncode == 0, "pull of a named file succeeds", r.stderr):
        return
    check(r.stdout.strip() == path, f"pull prints the cached path ({r.stdout.strip()})")
    check(read(path) == DREAMS, "the pulled file is byte-identical to the served one")
    check(not os.path.exists(path + ".partial"), "no partial file is left after a pull")
    resolve = [x for x in hub.requests("/tester/dreams-GGUF/resolve/main/")]
    check([x["method"] for x in resolve] == ["HEAD", "GET"] and all(x["status"] == 302 for x in resolve),
          "pull asks the resolve URL (HEAD for size and SHA-256, GET) and follows its redirect", str(resolve))
    check(len(cdn_gets(hub)) == 1 and cdn_gets(hub)[0]["range"] is None, "one whole GET of the blob")
    lines = [line for line in r.stderr.splitlines() if "%)" in line]
    check(len(lines) >= 5 and "(100%)" in lines[-1] and "/s, ETA" in lines[-1],
          "progress lines (bytes, percent, rate, ETA) go to a stderr that is not a terminal", r.stderr)
    check("\r" not in r.stderr, "no bar redrawn on a stderr that is not a terminal")

    before = len(hub.log)
    again = strata(hub, "pull", f"tester/dreams-GGUF:{NAME}", "--cache-dir", cache)
    check(again.returncode == 0 and "already downloaded" in again.stderr and again.stdout.strip() == path,
          "a second pull finds the file in the cache", again.stderr)
    check(len(hub.log) == before, "a second pull of a named file asks the hub nothing")

    prompt = ["-p", "Once upon a time", "-n", "24", "--temp", "0", "-t", "1"]
    reference = strata(hub, "run", "-m", MODEL, *prompt)
    for model in (f"tester/dreams-GGUF:{NAME}", "tester/dreams-GGUF"):
        before = len(hub.log)
        run = strata(hub, "run", "-m", model, *prompt, cache=cache)
        check(run.returncode == 0 and run.stdout == reference.stdout and reference.stdout.strip(),
              f"run -m {model} uses the cached file and writes what run -m FILE writes",
              run.stderr + run.stdout + "\nexpected: " + reference.stdout)
        check(len(hub.log) == before, f"run -m {model} with the file cached asks the hub nothing")


def test_run_pulls_what_is_missing(hub, cache):
    before = len(hub.log)
    run = strata(hub, "run", "-m", "tester/dreams-GGUF", "-p", "Once upon a time", "-n", "8", "--temp", "0",
                 cache=cache)
    check(run.returncode == 0 and run.stdout.strip(), "run -m OWNER/REPO pulls a model not in the cache",
          run.stderr)
    check(read(os.path.join(cache, "tester", "dreams-GGUF", NAME)) == DREAMS, "run -m put the file in the cache")
    check(any(x["path"] == "/api/models/tester/dreams-GGUF" for x in hub.log[before:]),
          "without FILE the repo's files are listed through the API")


def test_choice(hub, cache):
    r = strata(hub, "pull", "tester/multi-GGUF", "--cache-dir", cache)
    check(r.returncode == 0 and r.stdout.strip().endswith("multi-GGUF/dreams.Q4_K_M.gguf")
          and "taking dreams.Q4_K_M.gguf" in r.stderr, "of several GGUF files the Q4_K_M one is taken",
          r.stdout + r.stderr)
    check(r.returncode == 0 and read(r.stdout.strip()) == DREAMS, "the Q4_K_M file is the one downloaded")
    r = strata(hub, "pull", "tester/ambiguous-GGUF", "--cache-dir", cache)
    check(r.returncode == 1 and "name one as tester/ambiguous-GGUF:FILE: a.F16.gguf, a.Q8_0.gguf" in r.stderr,
          "without a Q4_K_M file the choices are listed", r.stderr)
    r = strata(hub, "pull", "tester/nothing-here:x.gguf", "--cache-dir", cache)
    check(r.returncode == 1 and "HTTP 404" in r.stderr and r.stderr.count("\n") == 1,
          "an unknown repo is one line naming HTTP 404", r.stderr)
    r = strata(hub, "pull", "not-a-repo", "--cache-dir", cache)
    check(r.returncode == 1 and "OWNER/REPO[:FILE]" in r.stderr, "a name that is no repo is refused", r.stderr)


def test_resume(hub, cache):
    ref = f"tester/dreams-GGUF:{NAME}"
    partial = os.path.join(cache, "tester", "dreams-GGUF", NAME + ".partial")
    hub.mode = "drop"
    start = len(cdn_gets(hub))
    r = strata(hub, "pull", ref, "--cache-dir", cache, "--retries", "1")
    gets = cdn_gets(hub, start)
    check(r.returncode == 1 and "kept in " + partial in r.stderr and "run the same command again to resume" in r.stderr,
          "a transfer that keeps breaking off fails, saying the partial file is kept", r.stderr)
    check(os.path.exists(partial) and os.path.getsize(partial) == sum(g["sent"] for g in gets),
          "the partial file holds every byte that arrived")
    check(len(gets) == 2 and gets[0]["range"] is None and gets[1]["range"] == f"bytes={gets[0]['sent']}-",
          "a broken-off transfer is resumed in the same run from where it stopped", str(gets))
    check(read(partial) == DREAMS[:os.path.getsize(partial)], "the partial file is the file's beginning")

    hub.mode = "normal"
    have = os.path.getsize(partial)
    start = len(cdn_gets(hub))
    r = strata(hub, "pull", ref, "--cache-dir", cache)
    gets = cdn_gets(hub, start)
    check(r.returncode == 0 and f"resuming {ref}" in r.stderr, "a later run resumes", r.stderr)
    check(len(gets) == 1 and gets[0]["range"] == f"bytes={have}-" and gets[0]["status"] == 206
          and gets[0]["sent"] == len(DREAMS) - have,
          f"the later run asks with a Range request from the partial file's size ({have})", str(gets))
    check(r.returncode == 0 and read(r.stdout.strip()) == DREAMS and not os.path.exists(partial),
          "the resumed file is byte-identical")

    os.remove(os.path.join(cache, "tester", "dreams-GGUF", NAME))
    hub.mode = "drop-once"
    start = len(cdn_gets(hub))
    r = strata(hub, "pull", ref, "--cache-dir", cache)
    gets = cdn_gets(hub, start)
    check(r.returncode == 0 and len(gets) == 2 and gets[1]["range"] == f"bytes={gets[0]['sent']}-"
          and "resuming in 1 s" in r.stderr and read(r.stdout.strip()) == DREAMS,
          "a connection dropped once is resumed and the file completed in one run", r.stderr + str(gets))

    os.remove(os.path.join(cache, "tester", "dreams-GGUF", NAME))
    hub.mode = "drop"
    strata(hub, "pull", ref, "--cache-dir", cache, "--retries", "0")
    hub.mode = "ignore-range"
    start = len(cdn_gets(hub))
    r = strata(hub, "pull", ref, "--cache-dir", cache)
    gets = cdn_gets(hub, start)
    check(r.returncode == 0 and "ignored the request to resume" in r.stderr and gets[0]["range"] is not None
          and gets[0]["status"] == 200 and read(r.stdout.strip()) == DREAMS,
          "a server that ignores Range gets the file written from the start", r.stderr + str(gets))
    hub.mode = "normal"


def test_wrong_bytes(hub, cache):
    ref = f"tester/dreams-GGUF:{NAME}"
    path = os.path.join(cache, "tester", "dreams-GGUF", NAME)
    hub.mode = "wrong-bytes"
    r = strata(hub, "pull", ref, "--cache-dir", cache)
    check(r.returncode == 1 and "SHA-256" in r.stderr and f"kept in {path}.partial" in r.stderr
          and "retry" in r.stderr, "wrong bytes are refused with the SHA-256 and the kept partial file named",
          r.stderr)
    check(not os.path.exists(path) and os.path.getsize(path + ".partial") == len(DREAMS),
          "a refused file is not renamed into place; its partial file is kept")
    hub.mode = "normal"
    start = len(cdn_gets(hub))
    r = strata(hub, "pull", ref, "--cache-dir", cache)
    gets = cdn_gets(hub, start)
    check(r.returncode == 0 and "downloading it anew" in r.stderr and len(gets) == 1 and gets[0]["range"] is None
          and read(path) == DREAMS, "the retry downloads a refused file anew", r.stderr + str(gets))


def test_token(hub, cache):
    ref = f"tester/private-GGUF:{NAME}"
    r = strata(hub, "pull", ref, "--cache-dir", cache)
    check(r.returncode == 1 and "HTTP 401" in r.stderr and "set HF_TOKEN" in r.stderr,
          "a private repo without HF_TOKEN is refused, suggesting HF_TOKEN", r.stderr)
    r = strata(hub, "pull", ref, "--cache-dir", cache, env={"HF_TOKEN": "hf_wrong"})
    check(r.returncode == 1 and "HTTP 401" in r.stderr and "may not read it" in r.stderr,
          "a wrong HF_TOKEN is refused", r.stderr)
    start = len(hub.log)
    r = strata(hub, "pull", "tester/private-GGUF", "--cache-dir", cache, env={"HF_TOKEN": TOKEN})
    check(r.returncode == 0 and read(r.stdout.strip()) == DREAMS, "HF_TOKEN opens a private repo", r.stderr)
    asked = [x for x in hub.log[start:] if not x["path"].startswith("/cdn/")]
    check(len(asked) >= 3 and all(x["authorization"] == f"Bearer {TOKEN}" for x in asked),
          "HF_TOKEN is sent as a bearer token to the API and resolve URLs", str(asked))


def test_terminal_bar(hub, cache):
    hub.mode, hub.delay = "slow", 0.02
    main, side = pty.openpty()
    environment = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    environment["HF_ENDPOINT"] = hub.endpoint
    process = subprocess.Popen([STRATA, "pull", f"tester/dreams-GGUF:{NAME}", "--cache-dir", cache],
                               stdout=subprocess.PIPE, stderr=side, env=environment)
    os.close(side)
    shown = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:
            break
        if not chunk:
            break
        shown += chunk
    process.wait(timeout=60)
    os.close(main)
    hub.mode = "normal"
    text = shown.decode(errors="replace")
    check(process.returncode == 0 and text.count("\r") >= 3 and "ETA" in text and "/s" in text and "[####" in text
          and "100%" in text, "on a terminal a bar with bytes, rate and ETA is redrawn in place", repr(text[-600:]))


def test_two_pulls_at_once(hub, cache):
    # Slow enough (about 3 s) for the second process to start while the first downloads.
    hub.mode, hub.delay = "slow", 0.05
    start = len(cdn_gets(hub))
    results = [None, None]

    def pull(i):
        results[i] = strata(hub, "pull", f"tester/dreams-GGUF:{NAME}", "--cache-dir", cache)

    threads = [threading.Thread(target=pull, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    hub.mode = "normal"
    check(all(r.returncode == 0 and read(r.stdout.strip()) == DREAMS for r in results),
          "two pulls of one file at once both succeed", "".join(r.stderr for r in results))
    check(len(cdn_gets(hub, start)) == 1 and any("waiting for another strata" in r.stderr for r in results),
          "two pulls of one file at once download it once, the second waiting", str(cdn_gets(hub, start)))


def main():
    hub = FakeHub().start()
    hub.add_repo("tester/dreams-GGUF", {NAME: DREAMS, "README.md": b"# dreams\n"})
    hub.add_repo("tester/multi-GGUF", {"dreams.Q8_0.gguf": OTHER, "dreams.Q4_K_M.gguf": DREAMS,
                                       "dreams.Q5_K_M.gguf": OTHER})
    hub.add_repo("tester/ambiguous-GGUF", {"a.Q8_0.gguf": OTHER, "a.F16.gguf": DREAMS})
    hub.add_repo("tester/private-GGUF", {NAME: DREAMS}, token=TOKEN)
    tests = [test_pull_and_run, test_run_pulls_what_is_missing, test_choice, test_resume, test_wrong_bytes,
             test_token, test_terminal_bar, test_two_pulls_at_once]
    for test in tests:
        cache = tempfile.mkdtemp(prefix="strata-pull-")
        del hub.log[:]
        try:
            print(f"--- {test.__name__}", flush=True)
            test(hub, cache)
        finally:
            hub.mode = "normal"
            shutil.rmtree(cache, ignore_errors=True)
    hub.stop()
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed", flush=True)
        return 1
    print("all pull checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
