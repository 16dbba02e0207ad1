"""The `attacks` phase of bench/bench.py: hostile clients on the node's network, against the
exporter and against nginx serving the same bytes under the same attack.

Each attack runs for a fixed window while a poller scrapes `/metrics` on a fresh connection every
0.5 s with a 15 s client timeout, as Prometheus scraping every 15 s or slower does (it reconnects
for every scrape). The figures are the worst and median scrape latency, the failed scrapes and the
server's peak resident memory. Prometheus gives up on a scrape at 10 s by default; the goal is
under 1 s.

Attackers come from 127.0.0.2 and the poller from 127.0.0.1, as an attacker and Prometheus have
different addresses on a real network. Every attacking connection the server closes is opened
again at once, so the pressure lasts the whole window.
"""

import http.client
import os
import resource
import selectors
import shutil
import socket
import ssl
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

POLL_EVERY_S = 0.5
POLL_TIMEOUT_S = 15
ATTACKER_ADDRESS = "127.0.0.2"
# A cost-10 bcrypt hash of "s3cret" (cost 10 is what the exporter-toolkit documentation suggests).
PASSWORD = "s3cret"
BCRYPT_HASH = "$2b$10$abcdefghijklmnopqrstuu3KWNuWLhBnmgYfnzONPueahDuedC/lu"
LOW_NOFILE = 256


def scrape_request(path="/metrics", auth=None):
    head = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    if auth:
        head += f"Authorization: {auth}\r\n"
    return (head + "\r\n").encode()


def basic(user, password):
    import base64
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


# name: (connections, bytes each connection sends once connected, whether it reads what it gets,
#        how the server is set up: "plain", "tls", "auth" or "nofile")
ATTACKS = {
    "silent connections": (2000, b"", False, "plain"),
    "idle kept-alive connections": (2000, scrape_request("/healthz"), True, "plain"),
    "pipeliners that never read": (600, scrape_request() * 50, False, "plain"),
    "stalled TLS handshakes": (300, b"\x16\x03\x01\x02\x00", False, "tls"),
    "connections past a low open-file limit": (600, b"", False, "nofile"),
    "unfinished 395 KB request heads": (510, b"GET / HTTP/1.1\r\nHost: a\r\nX-Pad: " + b"a" * 395_000, False, "plain"),
    "unfinished request bodies (Content-Length)": (1100, scrape_request().replace(b"\r\n\r\n", b"\r\nContent-Length: 65536\r\n\r\na"), False, "plain"),
    "unfinished request bodies (chunked)": (1100, scrape_request().replace(b"\r\n\r\n", b"\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n"), False, "plain"),
    "wrong passwords": (300, scrape_request("/metrics", basic("prometheus", "wrong")), True, "auth"),
}


class Attackers:
    """`count` connections from ATTACKER_ADDRESS, each sending `payload` once connected, reading and
    discarding answers when `reads` (then sending again: a client retrying wrong passwords), and
    reconnecting whenever the server closes one; all driven by one thread with epoll."""

    def __init__(self, port, count, payload, reads, tls=False):
        self.port, self.payload, self.reads = port, payload, reads
        self.sel = selectors.DefaultSelector()
        self.stop_flag = threading.Event()
        self.opened = 0
        for _ in range(count):
            self.open()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def open(self):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.bind((ATTACKER_ADDRESS, 0))
            s.connect_ex(("127.0.0.1", self.port))
        except OSError:
            s.close()
            return
        self.opened += 1
        self.sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE, [memoryview(self.payload)])

    def close(self, s):
        self.sel.unregister(s)
        s.close()

    def run(self):
        while not self.stop_flag.is_set():
            for key, events in self.sel.select(timeout=0.1):
                s, pending = key.fileobj, key.data
                try:
                    if events & selectors.EVENT_READ:
                        data = s.recv(65536)
                        if not data:
                            raise ConnectionError("closed")
                        if self.reads and not pending[0]:
                            pending[0] = memoryview(self.payload)  # answered: ask again
                    if events & selectors.EVENT_WRITE and pending[0]:
                        pending[0] = pending[0][s.send(pending[0]):]
                    mask = selectors.EVENT_READ | (selectors.EVENT_WRITE if pending[0] else 0)
                    if self.reads or pending[0]:
                        self.sel.modify(s, mask, pending)
                    else:
                        # Sent everything and reads nothing: watch only for the server closing.
                        self.sel.modify(s, selectors.EVENT_READ, pending)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    self.close(s)
                    self.open()

    def stop(self):
        self.stop_flag.set()
        self.thread.join()
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()
        self.sel.close()


def poll(port, seconds, tls_context=None, auth=None):
    """Fresh-connection scrapes every POLL_EVERY_S for `seconds`: (latencies in s, failures)."""
    latencies, failures = [], []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.monotonic()
        try:
            if tls_context:
                conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=POLL_TIMEOUT_S, context=tls_context)
            else:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=POLL_TIMEOUT_S)
            conn.request("GET", "/metrics", headers={"Authorization": auth} if auth else {})
            r = conn.getresponse()
            r.read()
            conn.close()
            if r.status != 200:
                raise OSError(f"status {r.status}")
            latencies.append(time.monotonic() - started)
        except OSError as e:
            failures.append(f"{time.monotonic() - started:.1f}s: {e}")
        time.sleep(max(0.0, POLL_EVERY_S - (time.monotonic() - started)))
    return latencies, failures


def rss_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024
    except (OSError, StopIteration):
        return 0.0


class PeakRss:
    """The highest VmRSS of `pid` (and of its children, for nginx's workers), sampled every 0.1 s."""

    def __init__(self, pids):
        self.pids, self.peak, self.done = pids, 0.0, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.done.wait(0.1):
            self.peak = max(self.peak, sum(rss_mib(p) for p in self.pids()))

    def stop(self):
        self.done.set()
        self.thread.join()
        return self.peak


def tls_files(directory):
    """A self-signed certificate and key for 127.0.0.1, made by openssl."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


def exporter_setup(mode, directory, cert, key):
    """(extra arguments, wrapper command) for the exporter in `mode`."""
    if mode == "tls":
        web = directory / "web-tls.yml"
        web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
        return ["--web-config", str(web)], ()
    if mode == "auth":
        web = directory / "web-auth.yml"
        web.write_text(f"basic_auth_users:\n  prometheus: '{BCRYPT_HASH}'\n")
        return ["--web-config", str(web)], ()
    if mode == "nofile":
        return [], ("prlimit", f"--nofile={LOW_NOFILE}:{LOW_NOFILE}", "--")
    return [], ()


def nginx_setup(mode, directory, cert, key):
    """(extra `server` directives, listen suffix, wrapper command) for nginx in `mode`."""
    if mode == "tls":
        return f"ssl_certificate {cert}; ssl_certificate_key {key};", " ssl", ()
    if mode == "auth":
        users = directory / "htpasswd"
        users.write_text(f"prometheus:{BCRYPT_HASH}\n")
        return f'auth_basic "metrics"; auth_basic_user_file {users};', "", ()
    if mode == "nofile":
        return "", "", ("prlimit", f"--nofile={LOW_NOFILE}:{LOW_NOFILE}", "--")
    return "", "", ()


def children(pid):
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def wait_ready(server, tls_context, timeout=30):
    """Until the exporter's `/readyz` (exempt from auth, so the poller's first scrape is still
    uncached) answers 200: NVML answered and a first tick completed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{server.cmd} exited with {server.proc.returncode}")
        try:
            if tls_context:
                conn = http.client.HTTPSConnection("127.0.0.1", server.port, timeout=2, context=tls_context)
            else:
                conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=2)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{server.cmd}: not ready within {timeout} s")


def attacks(ctx, Target, Nginx, fetch, log, seconds):
    """Every attack in ATTACKS against the exporter (8 GPUs) and nginx serving its bytes."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    directory = Path(tempfile.mkdtemp(prefix="bench-attacks-"))
    directory.chmod(0o755)
    cert, key = tls_files(directory)
    cert.chmod(0o644)
    key.chmod(0o644)  # nginx's workers run as nobody; the key is a throwaway
    insecure = ssl.create_default_context()
    insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE
    probe = Target("exporter", 8, ctx)
    try:
        probe.wait_complete()
        time.sleep(2.5)  # two more ticks: the body at its steady size, as in the scrape phase
        _, plain, headers = fetch(probe.port)
        _, zipped, _ = fetch(probe.port, gzip=True)
    finally:
        probe.stop()
    rows = []
    try:
        for name, (count, payload, reads, mode) in ATTACKS.items():
            for kind in ("exporter", "nginx"):
                if kind == "exporter":
                    args, wrapper = exporter_setup(mode, directory, cert, key)
                    server = Target("exporter", 8, ctx, wrapper=wrapper, args=args)
                    wait_ready(server, insecure if mode == "tls" else None)
                    pids = lambda s=server: [s.pid] + children(s.pid)
                else:
                    extra, listen, wrapper = nginx_setup(mode, directory, cert, key)
                    server = Nginx(plain, zipped, headers, server_extra=extra, listen_extra=listen, wrapper=wrapper)
                    pids = lambda s=server: [s.proc.pid] + children(s.proc.pid)
                try:
                    tls = insecure if mode == "tls" else None
                    auth = basic("prometheus", PASSWORD) if mode == "auth" else None
                    peak = PeakRss(pids)
                    attackers = Attackers(server.port, count, payload, reads)
                    time.sleep(1)  # the attack in place before the first scrape
                    latencies, failures = poll(server.port, seconds, tls, auth)
                    attackers.stop()
                    row = dict(attack=name, target=kind, connections=count, scrapes=len(latencies) + len(failures),
                               failures=len(failures), failure_reasons=failures[:5],
                               worst_ms=1e3 * max(latencies, default=float("nan")),
                               p50_ms=1e3 * statistics.median(latencies) if latencies else float("nan"),
                               rss_max_mib=round(peak.stop(), 1), attackers_opened=attackers.opened)
                    rows.append(row)
                    log(f"attack {name:40} {kind:8}: worst {row['worst_ms']:8.1f} ms, p50 {row['p50_ms']:7.1f} ms, "
                            f"{row['failures']}/{row['scrapes']} failed, RSS max {row['rss_max_mib']} MiB")
                finally:
                    server.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return rows
