#!/usr/bin/env python3
"""A node's port, keyless or keyed, answers no caller that lacks the cluster key: gRPC calls in
the clear (an unsigned Generate, ModelManifest and FetchTensor, a fake member announcing a
placement as its leader) and over TLS without a certificate of the cluster's authority get not
one HTTP/2 frame back, the placement stays put, and twelve such calls of 60 MiB each leave the
node's memory within 100 MB of where it was. A keyless node keeps its user's secret in its state
directory (made readable by that user only), itself readable by that user only; its API key
still guards its API.

usage: node_port_probe_test.py STRATA MODEL.gguf
"""
import concurrent.futures
import json
import os
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from cluster_processes_test import Node, answer, check, FAILURES, REQUESTS

PROTOCOL_VERSION = 5
BIG_CALL_BYTES = 60 << 20


def frame(kind, flags, stream, payload):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def literal(name, value):
    """An HPACK header field without indexing, its name given (both shorter than 127 bytes)."""
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b"")


def call_headers(method, stream=1):
    fields = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/strata.rpc.Node/" + method),
              (b":authority", b"strata"), (b"content-type", b"application/grpc"), (b"te", b"trailers"),
              (b"x-strata-sender", b"intruder")]
    return frame(1, 4, stream, b"".join(literal(n, v) for n, v in fields))


def grpc_message(message):
    return b"\x00" + struct.pack(">I", len(message)) + message


def varint(n):
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return out


def field(number, payload):
    """A length-delimited protobuf field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


# GenerateRequest{prompt: [1, 300], max_tokens: 8}
GENERATE = field(2, varint(1) + varint(300)) + varint(3 << 3) + varint(8)
# FetchTensorRequest{tensor: 0}: model_hash left empty
FETCH = b""
# HelloRequest{sender: {node_id: "0", protocol_version: 5}, placement: {epoch: 999999, leader_id: "0"}}:
# a fake member that says it leads a newer placement.
FAKE_LEADER = (field(1, field(1, b"0") + varint(5 << 3) + varint(PROTOCOL_VERSION)) +
               field(3, varint(1 << 3) + varint(999999) + field(2, b"0")))
CALLS = {b"Generate": GENERATE, b"ModelManifest": b"", b"FetchTensor": FETCH, b"Hello": FAKE_LEADER}


def self_signed_client_certificate(folder):
    key, cert = os.path.join(folder, "key.pem"), os.path.join(folder, "cert.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ed25519", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "2", "-subj", "/CN=strata-node"], check=True, capture_output=True)
    return key, cert


def connect(port, mode, certificate=None):
    """A connection to the node port: in the clear, or TLS (not checking the node's certificate)
    with no client certificate or with `certificate`."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    if mode == "clear":
        return sock
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    if certificate:
        context.load_cert_chain(certificate[1], certificate[0])
    return context.wrap_socket(sock, server_hostname="strata-node")


def exchange(port, mode, data, certificate=None):
    """Sends `data` and returns what comes back within a few seconds; refusals are empty."""
    received = b""
    try:
        with connect(port, mode, certificate) as sock:
            sock.sendall(data)
            deadline = time.time() + 3
            while time.time() < deadline:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += chunk
    except (OSError, ssl.SSLError):
        pass
    return received


def spoke_http2(received):
    """A SETTINGS frame first: the node took the connection as an HTTP/2 peer."""
    return len(received) >= 9 and received[3] == 4


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Peer:
    """The frames an HTTP/2 peer sends, read as they come: its settings and window updates."""

    def __init__(self, sock):
        self.sock, self.buffer = sock, b""
        self.connection_window, self.stream_window = 65535, 65535

    def read_frames(self, timeout):
        self.sock.settimeout(timeout)
        try:
            chunk = self.sock.recv(65536)
        except (socket.timeout, ssl.SSLError):
            return True
        if not chunk:
            return False
        self.buffer += chunk
        while len(self.buffer) >= 9:
            length = int.from_bytes(self.buffer[:3], "big")
            if len(self.buffer) < 9 + length:
                break
            kind, flags, stream = self.buffer[3], self.buffer[4], int.from_bytes(self.buffer[5:9], "big") & 0x7FFFFFFF
            payload, self.buffer = self.buffer[9:9 + length], self.buffer[9 + length:]
            if kind == 4 and not flags & 1:  # SETTINGS: its initial stream window, acknowledged
                for at in range(0, len(payload) - 5, 6):
                    if int.from_bytes(payload[at:at + 2], "big") == 4:
                        self.stream_window += int.from_bytes(payload[at + 2:at + 6], "big") - 65535
                self.sock.sendall(frame(4, 1, 0, b""))
            elif kind == 8:  # WINDOW_UPDATE
                increment = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
                if stream == 0:
                    self.connection_window += increment
                else:
                    self.stream_window += increment
            elif kind in (3, 7):  # RST_STREAM, GOAWAY: the call is over
                return False
        return True


def big_call(port, mode, certificate):
    """An unsigned call carrying 60 MiB, sent as fast as the node's flow control lets it."""
    try:
        with connect(port, mode, certificate) as sock:
            sock.sendall(PREFACE + call_headers(b"WriteKv"))
            peer = Peer(sock)
            body = grpc_message(b"\x00" * BIG_CALL_BYTES)
            at, deadline = 0, time.time() + 45
            while at < len(body) and time.time() < deadline:
                room = min(peer.connection_window, peer.stream_window, 16384, len(body) - at)
                if room <= 0:
                    if not peer.read_frames(1):
                        return
                    continue
                sock.sendall(frame(0, 1 if at + room == len(body) else 0, 1, body[at:at + room]))
                peer.connection_window -= room
                peer.stream_window -= room
                at += room
            peer.read_frames(2)
    except (OSError, ssl.SSLError):
        pass


def placement(node, key):
    request = urllib.request.Request(f"http://127.0.0.1:{node.port}/cluster",
                                     headers={"Authorization": f"Bearer {key}"} if key else {})
    with urllib.request.urlopen(request, timeout=10) as r:
        return json.loads(r.read())["placement"]


def probe(node, label, certificate, api_key=None):
    before = placement(node, api_key)
    for mode in ("clear", "tls", "tls-self-signed"):
        for method, message in CALLS.items():
            received = exchange(node.node_port, "clear" if mode == "clear" else "tls",
                                PREFACE + call_headers(method) + frame(0, 1, 1, grpc_message(message)),
                                certificate if mode == "tls-self-signed" else None)
            check(not spoke_http2(received) and b"grpc-status" not in received,
                  f"{label}: an unsigned {method.decode()} call ({mode}) gets no HTTP/2 frame back ({received[:24]!r})")
    after = placement(node, api_key)
    check(after["epoch"] == before["epoch"] and after["leader"] == before["leader"],
          f"{label}: a fake leader's placement was not adopted ({before['epoch']}/{before['leader']} -> "
          f"{after['epoch']}/{after['leader']})")

    start = rss_bytes(node.process.pid)
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        list(pool.map(lambda i: big_call(node.node_port, ("clear", "tls", "tls-self-signed")[i % 3], certificate),
                      range(12)))
    time.sleep(1)
    grown = rss_bytes(node.process.pid) - start
    check(grown < 100 << 20, f"{label}: twelve unsigned calls of 60 MiB grow the node by {grown >> 20} MiB (< 100)")


def api_status(node, key=None):
    request = urllib.request.Request(f"http://127.0.0.1:{node.port}/v1/models",
                                     headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def main():
    with tempfile.TemporaryDirectory() as folder:
        certificate = self_signed_client_certificate(folder)
        # This user's state directory, made by the node: the local secret is kept there.
        os.environ["XDG_STATE_HOME"] = folder
        state = os.path.join(folder, "strata")
        keyless = Node("p0", "--api-key", "api-secret")
        try:
            check(keyless.wait_healthy(), "the keyless node serves")
            mode = lambda path: oct(os.stat(path).st_mode & 0o777) if os.path.exists(path) else "missing"
            secret = os.path.join(state, "local-secret")
            check(mode(secret) == "0o600", f"the keyless node's secret is readable by its user only ({mode(secret)})")
            check(mode(state) == "0o700", f"the state directory it made is its user's only ({mode(state)})")
            check(api_status(keyless) == 401 and api_status(keyless, "api-secret") == 200,
                  "the API key still guards the API")
            probe(keyless, "keyless", certificate, "api-secret")
        finally:
            keyless.stop()

        keyed = Node("p1", "--cluster-key", "right", "--node-host", "127.0.0.1", "--no-discovery")
        try:
            check(keyed.wait_healthy(), "the keyed node serves")
            reference = answer(keyed.complete(REQUESTS[0]))
            probe(keyed, "keyed", certificate)
            check(answer(keyed.complete(REQUESTS[0])) == reference, "the keyed node answers as before the probe")
        finally:
            keyed.stop()
    print(f"{len(FAILURES)} failed" if FAILURES else "node port probe: all checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
