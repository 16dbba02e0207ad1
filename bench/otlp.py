#!/usr/bin/env python3
"""What an OTLP push costs beside a scrape (BENCHMARKS.md, "OTLP push").

For 8 and 64 simulated H100s, the release exporter runs three times with a tick every 100 ms,
each for --seconds: left alone (the baseline: sampling and encoding /metrics every tick), scraped
with gzip 10 times a second, and pushing over OTLP/HTTP with protobuf (gzip, the default) 10
times a second to a receiver in this process that reads each request and answers 200. At one
scrape or one push per tick, each scrape gzips a fresh exposition and each push converts and
encodes a fresh publication, so

    CPU per scrape = (CPU scraped - CPU alone) / scrapes
    CPU per push   = (CPU pushing - CPU alone) / pushes

from the process's utime + stime (/proc/PID/stat, every thread, ended ones included). Bytes:
a scrape's body plain and gzipped, a push's protobuf before compression
(nvml_exporter_otlp_request_bytes_total / exports) and as sent (its Content-Length). Writes
bench/results/<date>-otlp.json and prints a Markdown table. The three runs are one after the
other on a shared machine: compare within one run only.

    bench/otlp.py [--seconds 30] [--target DIR]   # DIR: cargo's target directory
"""

import argparse
import datetime
import gzip
import http.server
import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
SCENARIOS = {8: ROOT / "nvml-sim/scenarios/h100x8.toml", 64: BENCH / "scenarios/h100x64.toml"}
CLK_TCK = os.sysconf("SC_CLK_TCK")
RATE = 10  # scrapes or pushes a second, one per tick


def log(*a):
    print(*a, file=sys.stderr, flush=True)


class Receiver(http.server.ThreadingHTTPServer):
    """OTLP/HTTP: takes every POST, answers 200 with an empty ExportMetricsServiceResponse."""

    def __init__(self):
        self.sizes = []
        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        n = int(self.headers["Content-Length"])
        self.rfile.read(n)
        self.server.sizes.append(n)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def cpu_ticks(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def memory(pid, field):
    m = re.search(rf"^{field}:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    return int(m.group(1)) if m else 0


def fetch(port, gz=False):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept-Encoding": "gzip"} if gz else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read()


def value(body, name, labels=""):
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", body, re.M)
    return float(m.group(1)) if m else 0.0


def run(target, gpus, mode, seconds):
    """One exporter run: its CPU seconds over the window, requests made, and what it served."""
    receiver = Receiver() if mode == "push" else None
    args = [str(target / "release/nvml-exporter"), "--nvml-lib", str(target / "release/libnvml_sim.so"),
            "--listen", "127.0.0.1:0", "--interval", "100ms"]
    if receiver:
        args += ["--otlp-endpoint", f"http://127.0.0.1:{receiver.server_port}", "--otlp-protocol", "http/protobuf",
                 "--otlp-interval", f"{1000 // RATE}ms"]
    env = {**os.environ, "NVML_SIM_SCENARIO": str(SCENARIOS[gpus])}
    proc = subprocess.Popen(args, env=env, stderr=subprocess.PIPE, text=True)
    try:
        port = None
        for line in proc.stderr:
            m = re.search(r"listening address=127\.0\.0\.1:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        if port is None:
            sys.exit(f"the exporter did not start: {args}")
        threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
        # Settle: every GPU read, GPM windows closed, the first pushes made.
        deadline = time.time() + 30
        while time.time() < deadline and fetch(port).count(b"nvidia_gpu_up{") < gpus:
            time.sleep(0.2)
        time.sleep(3)
        pushes_before = len(receiver.sizes) if receiver else 0
        before, t0 = cpu_ticks(proc.pid), time.time()
        scrapes = 0
        while time.time() - t0 < seconds:
            if mode == "scrape":
                fetch(port, gz=True)
                scrapes += 1
                time.sleep(max(0.0, t0 + scrapes / RATE - time.time()))
            else:
                time.sleep(0.5)
        cpu = (cpu_ticks(proc.pid) - before) / CLK_TCK
        wall = time.time() - t0
        pushes = (len(receiver.sizes) - pushes_before) if receiver else 0
        text = fetch(port).decode()
        result = {"gpus": gpus, "mode": mode, "wall_s": round(wall, 2), "cpu_s": round(cpu, 3),
                  "scrapes": scrapes, "pushes": pushes, "vmhwm_kib": memory(proc.pid, "VmHWM"),
                  "scrape_bytes_plain": len(fetch(port)), "scrape_bytes_gzip": len(fetch(port, gz=True))}
        if receiver:
            exports = value(text, "nvml_exporter_otlp_exports_total", '{result="success"}')
            result["push_bytes_protobuf"] = round(value(text, "nvml_exporter_otlp_request_bytes_total") / exports)
            result["push_bytes_gzip"] = round(sum(receiver.sizes[-pushes:]) / pushes)
            result["push_points"] = round(value(text, "nvml_exporter_otlp_points_total", '{result="sent"}') / exports)
            result["push_failures"] = sum(value(text, "nvml_exporter_otlp_exports_total", f'{{result="{r}"}}')
                                          for r in ("unavailable", "timeout", "rejected"))
        log(json.dumps(result))
        return result
    finally:
        proc.terminate()
        proc.wait(10)
        if receiver:
            receiver.shutdown()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--target", type=Path, default=Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")))
    parser.add_argument("--out", type=Path, default=BENCH / f"results/{datetime.date.today()}-otlp.json")
    a = parser.parse_args()
    load_start = os.getloadavg()
    runs = [run(a.target, gpus, mode, a.seconds) for gpus in SCENARIOS for mode in ("alone", "scrape", "push")]
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    report = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "revision": rev,
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "load_average_start": load_start, "load_average_end": os.getloadavg()},
              "seconds": a.seconds, "rate_per_s": RATE, "runs": runs}
    a.out.write_text(json.dumps(report, indent=2) + "\n")
    rows = ["| GPUs | CPU ms per scrape (gzip) | CPU ms per push | bytes per scrape, plain / gzip | bytes per push, protobuf / gzip | points per push | VmHWM MiB alone / scraped / pushing |",
            "|---|---|---|---|---|---|---|"]
    for gpus in SCENARIOS:
        by = {r["mode"]: r for r in runs if r["gpus"] == gpus}
        alone = by["alone"]["cpu_s"] / by["alone"]["wall_s"]
        per = lambda r, n: (r["cpu_s"] - alone * r["wall_s"]) / n * 1000
        s, p = by["scrape"], by["push"]
        rows.append(f"| {gpus} | {per(s, s['scrapes']):.2f} | {per(p, p['pushes']):.2f} | "
                    f"{s['scrape_bytes_plain']:,} / {s['scrape_bytes_gzip']:,} | "
                    f"{p['push_bytes_protobuf']:,} / {p['push_bytes_gzip']:,} | {p['push_points']:,} | "
                    f"{by['alone']['vmhwm_kib'] / 1024:.1f} / {s['vmhwm_kib'] / 1024:.1f} / {p['vmhwm_kib'] / 1024:.1f} |")
    table = "\n".join(rows) + "\n"
    a.out.with_suffix(".md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
