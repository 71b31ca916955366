#!/usr/bin/env python3
"""A stand-in for the Hugging Face hub on 127.0.0.1, answering as the hub does for what
`strata pull` asks:

- GET /api/models/OWNER/REPO: the repo's JSON, with `siblings[].rfilename`;
- HEAD or GET /OWNER/REPO/resolve/main/FILE: a 302 to the file's blob at /cdn/SHA256 that
  carries X-Linked-Size and X-Linked-Etag (the size and SHA-256 the hub reports for LFS files);
- GET or HEAD /cdn/SHA256: the bytes, with Range requests answered by 206.

A repo added with a token answers 401 to the API and resolve URLs unless the request carries
`Authorization: Bearer TOKEN`. Faults, set with `mode` (on the blob downloads only): "drop"
sends half of what was asked for and closes the connection, "drop-once" does so once and then
serves normally, "wrong-bytes" serves the file with one byte changed, "ignore-range" answers
every request with the whole file (200), "slow" sends 16 KiB every `delay` seconds. Every
request is logged (method, path, Range, Authorization, status, body bytes sent).

Run alone to try `strata pull` by hand:
    fake_hub.py --port 8900 --repo me/dreams-GGUF=../shared/models/aidreams260K.gguf
    HF_ENDPOINT=http://127.0.0.1:8900 build/strata pull me/dreams-GGUF
"""
import argparse
import hashlib
import json
import os
import re
import socket
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeHub:
    def __init__(self, port=0):
        self.repos = {}  # "owner/repo" -> {"files": {name: bytes}, "token": str or None}
        self.blobs = {}  # sha256 hex -> bytes
        self.log = []
        self.mode = "normal"
        self.delay = 0.005
        self.lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_HEAD(self):
                hub._answer(self, head=True)

            def do_GET(self):
                hub._answer(self, head=False)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def add_repo(self, name, files, token=None):
        self.repos[name] = {"files": dict(files), "token": token}
        for content in files.values():
            self.blobs[hashlib.sha256(content).hexdigest()] = content

    def start(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def requests(self, prefix=""):
        with self.lock:
            return [r for r in self.log if r["path"].startswith(prefix)]

    def _answer(self, request, head):
        entry = {"method": request.command, "path": urllib.parse.urlsplit(request.path).path,
                 "range": request.headers.get("Range"), "authorization": request.headers.get("Authorization"),
                 "status": None, "sent": 0}
        with self.lock:
            self.log.append(entry)
        path = urllib.parse.unquote(entry["path"])
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)", path):
            self._api(request, entry, m.group(1), head)
        elif m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/main/(.+)", path):
            self._resolve(request, entry, m.group(1), m.group(2))
        elif m := re.fullmatch(r"/cdn/([0-9a-f]{64})", path):
            self._blob(request, entry, m.group(1), head)
        else:
            self._status(request, entry, 404, {"X-Error-Code": "EntryNotFound"})

    def _status(self, request, entry, status, headers=None, body=b""):
        entry["status"] = status
        request.send_response(status)
        for name, value in (headers or {}).items():
            request.send_header(name, value)
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        if body and request.command != "HEAD":
            request.wfile.write(body)

    def _repo(self, request, entry, name):
        repo = self.repos.get(name)
        if repo is None:
            self._status(request, entry, 404, {"X-Error-Code": "RepoNotFound"})
            return None
        if repo["token"] is not None and entry["authorization"] != f"Bearer {repo['token']}":
            self._status(request, entry, 401, {"X-Error-Code": "RepoNotFound",
                                               "X-Error-Message": "Invalid username or password."})
            return None
        return repo

    def _api(self, request, entry, name, head):
        repo = self._repo(request, entry, name)
        if repo is None:
            return
        body = json.dumps({"id": name, "modelId": name, "sha": "0" * 40,
                           "siblings": [{"rfilename": f} for f in sorted(repo["files"])]}).encode()
        self._status(request, entry, 200, {"Content-Type": "application/json"}, body)

    def _resolve(self, request, entry, name, file):
        repo = self._repo(request, entry, name)
        if repo is None:
            return
        content = repo["files"].get(file)
        if content is None:
            self._status(request, entry, 404, {"X-Error-Code": "EntryNotFound",
                                               "X-Error-Message": "Entry not found"})
            return
        sha = hashlib.sha256(content).hexdigest()
        self._status(request, entry, 302, {
            "Location": f"/cdn/{sha}?response-content-disposition=attachment",
            "X-Linked-Size": str(len(content)),
            "X-Linked-Etag": f'"{sha}"',
            "X-Repo-Commit": "0" * 40,
            "ETag": f'"{sha}"',
        })

    def _blob(self, request, entry, sha, head):
        content = self.blobs.get(sha)
        if content is None:
            self._status(request, entry, 404)
            return
        mode = self.mode
        if mode == "drop-once" and not head:
            self.mode = "normal"
            mode = "drop"
        if mode == "wrong-bytes":
            middle = len(content) // 2
            content = content[:middle] + bytes([content[middle] ^ 0xFF]) + content[middle + 1:]
        start, end, status = 0, len(content), 200
        asked = request.headers.get("Range")
        if asked and mode != "ignore-range":
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", asked)
            if not m or int(m.group(1)) >= len(content):
                self._status(request, entry, 416, {"Content-Range": f"bytes */{len(content)}"})
                return
            start = int(m.group(1))
            end = min(len(content), int(m.group(2)) + 1) if m.group(2) else len(content)
            status = 206
        entry["status"] = status
        request.send_response(status)
        request.send_header("Content-Type", "application/octet-stream")
        request.send_header("Content-Length", str(end - start))
        request.send_header("Accept-Ranges", "bytes")
        if status == 206:
            request.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(content)}")
        request.end_headers()
        if head:
            return
        body = content[start:end]
        if mode == "drop":
            body = body[:len(body) // 2]
        step = 16 << 10 if mode == "slow" else len(body) or 1
        for offset in range(0, len(body), step):
            chunk = body[offset:offset + step]
            # Counted first: the client may have it, and exit, before this thread runs again.
            entry["sent"] += len(chunk)
            request.wfile.write(chunk)
            request.wfile.flush()
            if mode == "slow":
                time.sleep(self.delay)
        if mode == "drop":
            request.close_connection = True
            request.connection.shutdown(socket.SHUT_WR)


def main():
    parser = argparse.ArgumentParser(description="A local stand-in for the Hugging Face hub")
    parser.add_argument("--port", type=int, default=8900)
    parser.add_argument("--repo", action="append", default=[], metavar="OWNER/REPO=FILE",
                        help="serve FILE in the repo (repeatable)")
    parser.add_argument("--token", help="require this bearer token for every repo")
    parser.add_argument("--mode", default="normal")
    args = parser.parse_args()
    hub = FakeHub(args.port)
    files = {}
    for spec in args.repo:
        name, path = spec.split("=", 1)
        with open(path, "rb") as f:
            files.setdefault(name, {})[os.path.basename(path)] = f.read()
    for name, repo_files in files.items():
        hub.add_repo(name, repo_files, args.token)
    hub.mode = args.mode
    print(f"fake hub on {hub.endpoint}", flush=True)
    hub.server.serve_forever()


if __name__ == "__main__":
    main()
