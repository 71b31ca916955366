#!/usr/bin/env python3
"""Attacks a real `strata serve` process as the hostile and careless clients of issue 12 do.

After each attack a normal request must be answered within --answer-bound seconds and the
server's RSS must be within 50 MB of its baseline; at the end the server must exit within its
grace period on SIGTERM while a client trickles bytes at it. Then N clients load it for a while,
and every answer must equal the same request's answer alone, with no 5xx.

Usage: hostile_clients.py STRATA_BINARY MODEL.gguf [--clients 16] [--seconds 10]
CI runs the defaults; the full run is --clients 64 --seconds 60 (docs/TESTING.md).
Only 127.0.0.1 is ever contacted.
"""
import argparse
import gzip
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

HOST = "127.0.0.1"
RSS_SLACK_MB = 50
failures = []


def check(condition, what):
    print(("ok   " if condition else "FAIL ") + what, flush=True)
    if not condition:
        failures.append(what)


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as status:
        return int(re.search(r"VmRSS:\s+(\d+)", status.read()).group(1)) / 1024


def request(port, method, path, body=None, headers=None, timeout=60):
    connection = http.client.HTTPConnection(HOST, port, timeout=timeout)
    connection.request(method, path, body=body, headers=headers or {})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, data


def chat(port, text, max_tokens=8):
    body = json.dumps({"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
                       "temperature": 0})
    status, data = request(port, "POST", "/v1/chat/completions", body,
                           {"Content-Type": "application/json"})
    return status, (json.loads(data)["choices"][0]["message"]["content"] if status == 200 else data)


def answered_promptly(port, bound, what):
    began = time.monotonic()
    health, _ = request(port, "GET", "/health", timeout=bound + 30)
    completion, _ = chat(port, "Are you still there?")
    took = time.monotonic() - began
    check(health == 200 and completion == 200 and took < bound,
          f"{what}: /health and a chat answered in {took:.2f} s")
    return took


def raw(port, data, read=True, timeout=30):
    """Sends raw bytes (as much as the server takes) and returns the status line it answers."""
    with socket.create_connection((HOST, port), timeout=timeout) as connection:
        try:
            connection.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server refused before the end: its answer is still there to read
        if not read:
            return ""
        answer = b""
        try:
            while chunk := connection.recv(65536):
                answer += chunk
        except (ConnectionResetError, socket.timeout):
            pass
        return answer.split(b"\r\n", 1)[0].decode(errors="replace")


def post_head(path, extra):
    return (f"POST {path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
            f"Connection: close\r\n{extra}\r\n").encode()


class Tricklers:
    """Connections that send half a header, then a byte every 2 s; and silent ones."""

    def __init__(self, port, trickling, silent):
        self.sockets = []
        for i in range(trickling + silent):
            s = socket.create_connection((HOST, port))
            if i < trickling:
                s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {HOST}\r\nX-Slow: ".encode())
            self.sockets.append((s, i < trickling))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def run(self):
        while not self.stop.wait(2):
            for s, trickles in self.sockets:
                try:
                    if trickles:
                        s.send(b"x")
                except OSError:
                    pass

    def close(self):
        self.stop.set()
        self.thread.join()
        for s, _ in self.sockets:
            s.close()


def attacks(port, pid, bound):
    baseline = rss_mb(pid)
    print(f"baseline RSS {baseline:.1f} MB", flush=True)

    def after(what):
        answered_promptly(port, bound, what)
        rss = rss_mb(pid)
        check(rss < baseline + RSS_SLACK_MB, f"{what}: RSS {rss:.1f} MB (baseline {baseline:.1f})")

    # More than one client address may hold (256): the oldest give way.
    slow = Tricklers(port, trickling=80, silent=200)
    time.sleep(1)
    answered_promptly(port, bound, "80 trickling + 200 silent connections open")
    slow.close()
    after("slow and silent connections")

    slow_body = socket.create_connection((HOST, port))
    slow_body.sendall(post_head("/v1/completions", "Content-Length: 100000\r\n") + b"{")
    answered_promptly(port, bound, "a body sent slowly")
    slow_body.close()

    chunked = post_head("/v1/completions", "Transfer-Encoding: chunked\r\n")
    piece = b"a" * 1_000_000
    chunked += (b"%x\r\n" % len(piece) + piece + b"\r\n") * 40 + b"0\r\n\r\n"
    status = raw(port, chunked)
    check(" 413 " in status, f"40 MB chunked body: {status}")
    after("40 MB chunked body")

    bomb = gzip.compress(b"\0" * 200_000_000, compresslevel=9)
    status = raw(port, post_head("/v1/completions", f"Content-Encoding: gzip\r\nContent-Length: {len(bomb)}\r\n") + bomb)
    check(" 415 " in status, f"gzip bomb ({len(bomb) // 1000} KB to 200 MB): {status}")
    after("gzip bomb")

    flood = f"GET /v1/models HTTP/1.1\r\nHost: {HOST}\r\n".encode() + b"X-Flood: 1234567\r\n" * 3_000_000
    results = []
    floods = [threading.Thread(target=lambda: results.append(raw(port, flood + b"\r\n"))) for _ in range(6)]
    for t in floods:
        t.start()
    for t in floods:
        t.join()
    check(all(" 431 " in r for r in results), f"six floods of 3,000,000 headers ({len(flood) // 1_000_000} MB): {set(results)}")
    after("header floods")

    for name, body in [("8 MB of '['", b"[" * 8_000_000),
                       ("8 MB prompt", json.dumps({"prompt": "dream " * 1_300_000}).encode())]:
        began = time.monotonic()
        status = raw(port, post_head("/v1/completions", f"Content-Length: {len(body)}\r\n") + body)
        check(" 400 " in status, f"{name}: {status} in {time.monotonic() - began:.2f} s")
        after(name)


def load(port, clients, seconds):
    prompts = [f"Tell me dream number {i}" for i in range(8)]
    solo = {p: chat(port, p, 16) for p in prompts}
    check(all(status == 200 for status, _ in solo.values()), "solo answers")
    counts = {"answers": 0, "mismatches": 0, "5xx": 0, "other": 0, "connection errors": 0}
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def client(index):
        i = index
        while time.monotonic() < deadline:
            prompt = prompts[i % len(prompts)]
            i += 1
            try:
                status, text = chat(port, prompt, 16)
            except (OSError, http.client.HTTPException):
                with lock:
                    counts["connection errors"] += 1
                continue
            with lock:
                counts["answers"] += 1
                if status >= 500:
                    counts["5xx"] += 1
                elif status != 200:
                    counts["other"] += 1
                elif text != solo[prompt][1]:
                    counts["mismatches"] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(counts["answers"] > 0 and all(counts[k] == 0 for k in counts if k != "answers"),
          f"{clients} clients for {seconds} s: {counts}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("strata")
    parser.add_argument("model")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--answer-bound", type=float, default=5.0,
                        help="seconds a normal request may take after an attack (2 s unloaded)")
    parser.add_argument("--grace", type=float, default=10.0, help="the server's stop grace period")
    args = parser.parse_args()

    server = subprocess.Popen([args.strata, "serve", "-m", args.model, "--host", HOST, "--port", "0",
                               "--parallel", "4", "--queue", "256"],
                              stderr=subprocess.PIPE, text=True)
    port = None
    for line in server.stderr:
        match = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
        if match:
            port = int(match.group(1))
            break
    if port is None:
        sys.exit("the server did not start")
    threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()
    # /health answers 503 while the node places and loads the model.
    deadline = time.monotonic() + 60
    while request(port, "GET", "/health")[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        attacks(port, server.pid, args.answer_bound)
        load(port, args.clients, args.seconds)
        trickler = socket.create_connection((HOST, port))
        trickler.sendall(f"GET /health HTTP/1.1\r\nHost: {HOST}\r\nX-Slow: ".encode())
        began = time.monotonic()
        server.send_signal(signal.SIGTERM)
        try:
            while server.poll() is None and time.monotonic() - began < args.grace + 5:
                try:
                    trickler.send(b"x")
                except OSError:
                    pass
                time.sleep(0.2)
            took = time.monotonic() - began
            check(server.poll() == 0 and took < args.grace,
                  f"SIGTERM with a client trickling bytes: exited ({server.poll()}) in {took:.2f} s")
        finally:
            trickler.close()
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()
    if failures:
        sys.exit(f"{len(failures)} check(s) failed")


if __name__ == "__main__":
    main()
