#!/usr/bin/env python3
"""The benchmark harness behind bench/run.sh (see BENCHMARKS.md).

In one run, the release exporter and two peer exporters (nvitop-exporter from PyPI, all-smi's
API mode from crates.io) read the same simulated driver (nvml-sim), and it measures: scrape cost
(wrk) of each, and of nginx serving the exporter's body; series and bytes per scrape; footprint
(RSS, CPU share from /proc) idle and under a 1/s scrape; tick cost (the exporter's own histogram,
its CPU time, and a callgrind profile split into NVML and exporter work); startup time; and
the worst fresh-connection scrape under hostile clients, beside nginx (bench/attacks.py).
With --baseline, a second exporter build runs as one more process in every phase, so two builds
are compared under the same conditions. Results go to bench/results/<date>.json and a Markdown
table next to it. Only ratios within one run are compared: the machine is shared and noisy.
"""

import argparse
import datetime
import gzip as gz
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import attacks

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
SCENARIOS = {1: BENCH / "scenarios/h100x1.toml", 8: ROOT / "nvml-sim/scenarios/h100x8.toml", 64: BENCH / "scenarios/h100x64.toml"}
CLK_TCK = os.sysconf("SC_CLK_TCK")
# The peers: other exporters of the same GPUs, started by Target.
PEERS = ("nvitop-exporter", "all-smi")
# One line per GPU it reads in a server's /metrics: for an exporter build `nvidia_gpu_up 1`, for a
# peer its per-GPU total memory (each lists every GPU it found, once).
GPU_LINE = {
    "exporter": re.compile(rb'^nvidia_gpu_up\{[^}]*\} 1(?:\.0)?$', re.M),
    "nvitop-exporter": re.compile(rb'^gpu_memory_total_MiB\{', re.M),
    "all-smi": re.compile(rb'^all_smi_gpu_memory_total_bytes\{', re.M),
}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fetch(port, path="/metrics", gzip=False, timeout=10):
    """(status, body as sent, headers) of one GET."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Accept-Encoding": "gzip"} if gzip else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read(), r.headers


def gpus_up(port, kind="exporter"):
    """GPUs a server of `kind` reads, by its current /metrics (GPU_LINE), or -1 when it does not
    answer."""
    try:
        return len(GPU_LINE.get(kind, GPU_LINE["exporter"]).findall(fetch(port, timeout=2)[1]))
    except OSError:
        return -1


def exposition(port):
    """(series, bytes, gzipped) of a server's /metrics as Prometheus gets it: gzip accepted, the
    bytes as sent, whether they came gzipped."""
    _, body, headers = fetch(port, gzip=True)
    gzipped = headers.get("Content-Encoding") == "gzip"
    text = gz.decompress(body) if gzipped else body
    series = sum(1 for line in text.splitlines() if line.strip() and not line.startswith(b"#"))
    return series, len(body), gzipped


def cpu_split():
    """(server CPUs, load CPUs) for the scrape phase: the upper half of this process's CPUs for the
    server under test, the lower half for wrk, so that the load generator never takes a core the
    server is waiting for (on two cores: one each). None on a single CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    half = len(cpus) // 2
    return cpus[half:], cpus[:half]


def pinned(cpus):
    """A `preexec_fn` that confines the child (and every thread it starts) to `cpus`; None for
    no pinning."""
    return None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))


def nvidia_smi_stand_in(ctx, gpus):
    """A directory holding `nvidia-smi`: a shell script that answers `-L` with the listing
    bench/nvidia_smi.py reads through NVML for the scenario of `gpus` (made once per run). all-smi
    gives `nvidia-smi -L` 0.5 s to answer in a container (2 s elsewhere), less than a Python start
    takes on a loaded machine; the script answers in milliseconds."""
    path = Path(ctx.fake_driver) / f"nvidia-smi-{gpus}"
    if not path.exists():
        env = dict(os.environ, LD_LIBRARY_PATH=ctx.fake_driver, NVML_SIM_SCENARIO=str(SCENARIOS[gpus]))
        listing = subprocess.run([sys.executable, str(BENCH / "nvidia_smi.py"), "-L"], env=env, capture_output=True, text=True, check=True).stdout
        path.mkdir()
        script = path / "nvidia-smi"
        script.write_text(f"#!/bin/sh\n# nvidia-smi -L on {SCENARIOS[gpus].name}, as bench/nvidia_smi.py read it through NVML\n"
                          f"[ \"$*\" = -L ] || {{ echo \"nvidia-smi stand-in: only -L is answered\" >&2; exit 2; }}\n"
                          f"cat <<'EOF'\n{listing}EOF\n")
        script.chmod(0o755)
    return str(path)


class Target:
    """A server process under test: an exporter build ("exporter", or "baseline" for the build
    it is compared with) or a peer (PEERS). The peers load nvml-sim as `libnvidia-ml.so.1` from
    ctx.fake_driver, as they would load a driver, and log warnings only, as the builds do."""

    def __init__(self, kind, gpus, ctx, interval="1s", wrapper=(), cpus=None, args=()):
        self.kind, self.gpus, self.port = kind, gpus, free_port()
        self.home = None
        env = dict(os.environ, NVML_SIM_SCENARIO=str(SCENARIOS.get(gpus, "")))
        seconds = interval.removesuffix("s")
        if kind in ctx.builds:
            exporter, sim = ctx.builds[kind]
            cmd = [*wrapper, exporter, "--nvml-lib", sim, "--listen", f"127.0.0.1:{self.port}", "--interval", interval, "--log-level", "warn", *args]
        elif kind == "nvitop-exporter":
            env["LD_LIBRARY_PATH"] = ctx.fake_driver
            cmd = [sys.executable, "-m", "nvitop_exporter", "--bind-address", "127.0.0.1", "--port", str(self.port), "--interval", seconds]
        elif kind == "all-smi":
            # all-smi finds NVIDIA GPUs through `nvidia-smi -L` and keeps an energy journal under
            # its cache directory: one of its own per process.
            self.home = tempfile.mkdtemp(prefix="bench-all-smi-")
            env.update(LD_LIBRARY_PATH=ctx.fake_driver, PATH=nvidia_smi_stand_in(ctx, gpus) + os.pathsep + env["PATH"], RUST_LOG="warn",
                       HOME=self.home, XDG_CACHE_HOME=self.home, XDG_CONFIG_HOME=self.home)
            cmd = [ctx.all_smi, "api", "--port", str(self.port), "--interval", seconds]
        else:
            raise ValueError(kind)
        self.cmd = cmd
        self.started = time.perf_counter()
        self.output = tempfile.TemporaryFile()  # what it prints, shown when it fails to start
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.output, stderr=subprocess.STDOUT,
                                     preexec_fn=pinned(cpus))
        self.pid = self.proc.pid

    def wait_complete(self, timeout=30.0):
        """Seconds from exec until /metrics shows every GPU up."""
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if gpus_up(self.port, self.kind) == self.gpus:
                return time.perf_counter() - self.started
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.cmd} exited with {self.proc.returncode}{self.printed()}")
            time.sleep(0.002)
        raise RuntimeError(f"{self.kind} with {self.gpus} GPUs: not complete within {timeout} s (GPUs seen: "
                           f"{gpus_up(self.port, self.kind)}){self.printed()}")

    def printed(self):
        """The end of what the process printed, for an error message."""
        self.output.seek(0)
        return "; it printed:\n" + self.output.read()[-2000:].decode(errors="replace")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.output.close()
        if self.home:
            shutil.rmtree(self.home, ignore_errors=True)


class Nginx:
    """nginx as a plain process on a free port serving a captured body (and its .gz) as static files,
    with the Debian package's `sendfile on; tcp_nopush on;` (its shipped nginx.conf has both): the
    file is sent from the page cache, not read into a buffer and written."""

    kind = "nginx"

    def __init__(self, plain, gzipped, headers, cpus=None, server_extra="", listen_extra="", wrapper=()):
        self.dir = Path(tempfile.mkdtemp(prefix="bench-nginx-"))
        self.dir.chmod(0o755)  # the workers run as nobody
        (self.dir / "metrics").write_bytes(plain)
        (self.dir / "metrics.gz").write_bytes(gzipped)
        self.port = free_port()
        ctype = headers.get("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        (self.dir / "nginx.conf").write_text(f"""
worker_processes {len(cpus) if cpus else "auto"};
pid {self.dir}/nginx.pid;
error_log {self.dir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  sendfile on; tcp_nopush on;
  access_log off;
  client_body_temp_path {self.dir}; proxy_temp_path {self.dir}; fastcgi_temp_path {self.dir};
  uwsgi_temp_path {self.dir}; scgi_temp_path {self.dir};
  server {{
    listen 127.0.0.1:{self.port}{listen_extra};
    root {self.dir};
    {server_extra}
    location = /metrics {{ types {{ }} default_type "{ctype}"; gzip_static on; gzip_vary on; }}
  }}
}}
""")
        self.proc = subprocess.Popen([*wrapper, "nginx", "-p", str(self.dir), "-c", str(self.dir / "nginx.conf"), "-g", "daemon off;"], stdout=subprocess.DEVNULL,
                                     preexec_fn=pinned(cpus))
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("nginx did not start")

    def stop(self):
        # A graceful stop first; out of descriptors (the attacks phase) nginx may not manage one.
        for sig in (signal.SIGQUIT, signal.SIGTERM):
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            subprocess.run(["pkill", "-KILL", "-f", str(self.dir)])
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def wrk(port, conns, seconds, gzip, cpus=None):
    """One wrk run, one thread per CPU in `cpus` (all when None); its JSON line plus requests per
    second."""
    threads = 1 if conns == 1 else len(cpus or os.sched_getaffinity(0))
    cmd = ["wrk", "-t", str(threads), "-c", str(conns), "-d", f"{seconds}s", "--timeout", "10s", "-s", str(BENCH / "wrk-report.lua"), f"http://127.0.0.1:{port}/metrics"]
    out = subprocess.run(cmd, env=dict(os.environ, WRK_GZIP="1" if gzip else "0"), capture_output=True, text=True, check=True,
                         preexec_fn=pinned(cpus)).stdout
    res = json.loads(out.split("WRK_JSON ", 1)[1].splitlines()[0])
    res["rps"] = res["requests"] / (res["duration_us"] / 1e6)
    res["command"] = " ".join(cmd)
    return res


def scrape_cost(ctx):
    """Throughput and latency of the exporter, nginx (same body) and the peers at 1 and 16 clients,
    8 and 64 GPUs, plain and gzip accepted (a server that does not compress answers plain); each
    server on the CPUs of `cpu_split`, wrk on the others. Also each server's series and bytes
    per scrape. A baseline build runs right after the exporter at each load. Each peer runs alone,
    after the others have stopped: a peer updating every second on the server's CPU would take it
    from the server under test."""
    server_cpus, load_cpus = ctx.scrape_cpus or (None, None)
    rows, sizes = [], []

    def measure(group, gpus):
        # The servers of a group take turns at each load, so that a drift in the machine's load
        # touches all of them.
        for server in group:
            if server.kind != "nginx":
                series, size, gzipped = exposition(server.port)
                sizes.append(dict(target=server.kind, gpus=gpus, series=series, bytes=size, gzip=gzipped, plain_bytes=len(fetch(server.port)[1])))
                log(f"exposition {server.kind:15} {gpus:2} GPUs: {series} series, {size} bytes{' gzipped' if gzipped else ''}")
        body = {s: {False: len(fetch(s.port)[1]), True: len(fetch(s.port, gzip=True)[1])} for s in group}
        for gzip in (False, True):
            for conns in (1, 16):
                for server in group:
                    name = server.kind
                    r = wrk(server.port, conns, ctx.scrape_seconds, gzip, cpus=load_cpus)
                    r.update(target=name, gpus=gpus, encoding="gzip" if gzip else "plain", conns=conns, body_bytes=body[server][gzip])
                    log(f"scrape {name:15} {gpus:2} GPUs {r['encoding']:5} c={conns:2}: {r['rps']:9.1f} req/s p50 {r['p50_us']/1e3:8.2f} ms p99 {r['p99_us']/1e3:8.2f} ms errors {r['errors']}")
                    rows.append(r)

    for gpus in (8, 64):
        servers = []
        try:
            for kind in ctx.builds:
                servers.append(Target(kind, gpus, ctx, cpus=server_cpus))
                servers[-1].wait_complete()
            exp = servers[0]
            time.sleep(2.5)  # two more ticks: GPM averages present, the body at its steady size
            _, plain, headers = fetch(exp.port)
            _, zipped, zheaders = fetch(exp.port, gzip=True)
            assert zheaders.get("Content-Encoding") == "gzip", zheaders
            assert gz.decompress(zipped).count(b"\n") > 0
            servers.append(Nginx(plain, zipped, headers, cpus=server_cpus))
            measure(servers[:-1], gpus)
            measure(servers[-1:], gpus)
        finally:
            for server in reversed(servers):
                server.stop()
        for kind in PEERS:
            peer = Target(kind, gpus, ctx, cpus=server_cpus)
            try:
                peer.wait_complete(60)
                time.sleep(2.5)  # its second update: every series present
                measure([peer], gpus)
            finally:
                peer.stop()
    return rows, sizes


def proc_sample(pid):
    """(cpu ticks utime+stime of all threads, VmRSS KiB, RssAnon KiB, RssFile KiB) of a process.

    RssAnon is the process's own memory (heap, stacks); RssFile is the pages of the executable
    and shared libraries it has touched (the interpreter, libc, the NVML library), a floor that
    no change to the heap moves."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    ticks = int(fields[11]) + int(fields[12])
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    kib = lambda key: int(status[key].split()[0])
    return ticks, kib("VmRSS"), kib("RssAnon"), kib("RssFile")


def thread_runtimes(pid):
    """{thread id: nanoseconds on a CPU} from each thread's schedstat: exact, where utime+stime
    come in clock ticks too coarse for a process that uses a fraction of a percent of a core."""
    times = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            times[tid] = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return times


def cpu_seconds_between(before, after, ticks_s):
    """CPU seconds of a process between two `thread_runtimes`, or `ticks_s` (the clock-tick
    figure, which counts ended threads too) when a thread ended in between: one that was there
    before is gone, or the sum falls short of the ticks by more than their rounding (two ticks),
    as when threads are started and ended per request. Returns (seconds, source)."""
    exact = sum(after[t] - before.get(t, 0) for t in after) / 1e9
    if set(before) <= set(after) and exact >= ticks_s - 2 / CLK_TCK:
        return exact, "schedstat"
    return ticks_s, "clock ticks"


def histogram_totals(port):
    """(sum, count) of nvml_exporter_sample_duration_seconds from the exporter's /metrics."""
    body = fetch(port)[1].decode()
    s = float(re.search(r"^nvml_exporter_sample_duration_seconds_sum(?:\{\})? (\S+)$", body, re.M).group(1))
    c = float(re.search(r"^nvml_exporter_sample_duration_seconds_count(?:\{\})? (\S+)$", body, re.M).group(1))
    return s, c


def footprint(ctx):
    """RSS and CPU share over ctx.footprint_seconds at 1 s, all configurations in parallel."""
    configs = [(kind, gpus, scraped) for kind in (*ctx.builds, *PEERS) for gpus in (1, 8, 64) for scraped in (False, True)]
    targets = []
    stop = threading.Event()
    try:
        for kind, gpus, _ in configs:
            targets.append(Target(kind, gpus, ctx))
            # An exporter ticks on a fixed schedule from its start. Started together, they would
            # tick in lockstep, all at once, which no node sees (it runs one): spread the starts,
            # and so the ticks, over the interval.
            time.sleep(1 / len(configs))
        for t in targets:
            t.wait_complete(60)
        time.sleep(2)  # past start-up allocations and the first GPM window

        def scraper(port, offset):
            # Prometheus-like: one scrape per second, gzip accepted, on a fixed schedule; the
            # scrapers' schedules spread over the second like the exporters' ticks.
            next_at = time.monotonic() + offset
            stop.wait(offset)
            while not stop.is_set():
                fetch(port, gzip=True)
                next_at += 1
                stop.wait(max(0, next_at - time.monotonic()))

        hist0 = {i: histogram_totals(t.port) for i, t in enumerate(targets) if t.kind in ctx.builds}
        scraped = [t for t, c in zip(targets, configs) if c[2]]
        threads = [threading.Thread(target=scraper, args=(t.port, n / len(scraped)), daemon=True) for n, t in enumerate(scraped)]
        series = {i: [] for i in range(len(targets))}
        start = time.monotonic()
        first = {i: proc_sample(t.pid) for i, t in enumerate(targets)}
        runtimes0 = {i: thread_runtimes(t.pid) for i, t in enumerate(targets)}
        for th in threads:
            th.start()
        for k in range(1, ctx.footprint_seconds + 1):
            time.sleep(max(0, start + k - time.monotonic()))
            for i, t in enumerate(targets):
                series[i].append(proc_sample(t.pid))
        elapsed = time.monotonic() - start
        runtimes1 = {i: thread_runtimes(t.pid) for i, t in enumerate(targets)}
        stop.set()
        for th in threads:
            th.join(5)
        hist1 = {i: histogram_totals(t.port) for i, t in enumerate(targets) if t.kind in ctx.builds}
    finally:
        stop.set()
        for t in targets:
            t.stop()
    rows = []
    for i, (kind, gpus, scraped) in enumerate(configs):
        rss = [r for _, r, _, _ in series[i]]
        anon = [a for _, _, a, _ in series[i]]
        file = [f for _, _, _, f in series[i]]
        ticks_s = (series[i][-1][0] - first[i][0]) / CLK_TCK
        cpu_s, cpu_source = cpu_seconds_between(runtimes0[i], runtimes1[i], ticks_s)
        row = dict(target=kind, gpus=gpus, scrape="1/s" if scraped else "idle", seconds=round(elapsed, 2),
                   cpu_share=cpu_s / elapsed, cpu_seconds=cpu_s, cpu_source=cpu_source,
                   cpu_seconds_clock_ticks=ticks_s, rss_kib=rss, rss_anon_kib=anon, rss_file_kib=file,
                   rss_start_mib=rss[0] / 1024, rss_max_mib=max(rss) / 1024, rss_end_mib=rss[-1] / 1024,
                   rss_anon_max_mib=max(anon) / 1024, rss_file_max_mib=max(file) / 1024)
        if kind in ctx.builds:
            ds, dc = hist1[i][0] - hist0[i][0], hist1[i][1] - hist0[i][1]
            row.update(ticks=dc, tick_wall_s=ds / dc, tick_wall_per_gpu_s=ds / dc / gpus,
                       cpu_per_tick_per_gpu_s=cpu_s / dc / gpus)
        log(f"footprint {kind:8} {gpus:2} GPUs {row['scrape']:4}: RSS max {row['rss_max_mib']:6.1f} MiB (anon {row['rss_anon_max_mib']:.1f}, file {row['rss_file_max_mib']:.1f}), CPU {100 * row['cpu_share']:6.2f} %")
        rows.append(row)
    return rows


def parse_callgrind(path, nvml_object):
    """(total Ir, Ir inside the NVML library including what it calls) from a callgrind output file."""
    names = {}

    def name(kind, value):
        m = re.match(r"\((\d+)\)(?: (.*))?", value)
        if not m:
            return value
        if m.group(2) is not None:
            names[(kind, m.group(1))] = m.group(2)
        return names.get((kind, m.group(1)), "")

    total, inside = 0, 0
    ob = cob = ""
    in_call = False
    with open(path) as f:
        for line in f:
            if line.startswith("ob="):
                ob = name("ob", line[3:].strip())
            elif line.startswith("cob="):
                cob = name("ob", line[4:].strip())
            elif line.startswith("cfn=") or line.startswith("cfi=") or line.startswith("cfl="):
                pass
            elif line.startswith("fn="):
                cob = ""
            elif line.startswith("calls="):
                in_call = True
            elif line[:1].isdigit() or line[:1] in "+-*":
                parts = line.split()
                cost = int(parts[1]) if len(parts) > 1 else 0
                if in_call:
                    # The inclusive cost of a call: NVML time when code outside calls into it.
                    callee = cob or ob
                    if callee.endswith(nvml_object) and not ob.endswith(nvml_object):
                        inside += cost
                    in_call = False
                    cob = ""
                else:
                    total += cost
    return total, inside


def nvml_object(ctx, kind):
    """The file name of the NVML library a build loads, as profiles name it (links resolved)."""
    return Path(ctx.builds[kind][1]).resolve().name


def tick_profile(ctx, gpus, window, kind="exporter"):
    """Callgrind over `window` seconds of steady ticking (start-up excluded): NVML vs exporter."""
    out = Path(tempfile.mkdtemp(prefix="bench-cg-")) / "callgrind.out"
    wrapper = ("valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}")
    t = Target(kind, gpus, ctx, interval="1s", wrapper=wrapper)
    try:
        t.wait_complete(180)
        subprocess.run(["callgrind_control", "-i", "on", str(t.pid)], check=True, capture_output=True)
        c0 = histogram_totals(t.port)[1]
        time.sleep(window)
        c1 = histogram_totals(t.port)[1]
        subprocess.run(["callgrind_control", "-i", "off", str(t.pid)], check=True, capture_output=True)
    finally:
        t.stop()
    total, inside = parse_callgrind(out, nvml_object(ctx, kind))
    ticks = c1 - c0
    annotate = subprocess.run(["callgrind_annotate", "--inclusive=no", "--threshold=95", str(out)], capture_output=True, text=True).stdout
    top = [line for line in annotate.splitlines() if re.match(r"^\s*[\d,]+ \(", line)][:25]
    shutil.rmtree(out.parent, ignore_errors=True)
    row = dict(target=kind, gpus=gpus, window_s=window, ticks=ticks, ir_total=total, ir_nvml=inside, ir_exporter=total - inside,
               nvml_share=inside / total, ir_exporter_per_tick_per_gpu=(total - inside) / ticks / gpus, top_self=top)
    log(f"callgrind {kind} {gpus} GPUs: {ticks:.0f} ticks, NVML {100 * row['nvml_share']:.1f} % of instructions, exporter {row['ir_exporter_per_tick_per_gpu']:.0f} Ir per tick per GPU")
    return row


def perf_split(script_text, nvml_object):
    """(samples, samples with `nvml_object` anywhere in their stack) from `perf script` output."""
    total = inside = 0
    for block in script_text.split("\n\n"):
        lines = [line for line in block.strip().splitlines() if line.strip()]
        if len(lines) < 2:
            continue
        total += 1
        if any(nvml_object in line for line in lines[1:]):
            inside += 1
    return total, inside


def time_profile(ctx, gpus, window, kind="exporter"):
    """perf samples (CPU clock, with call stacks) of the exporter over `window` seconds of steady
    ticking: the share of its CPU time whose stack is inside NVML, kernel time included. Unlike
    the instruction share, this charges the exporter with the system calls and context switches
    it causes and weighs each instruction by what it costs. None without a usable `perf`."""
    if not shutil.which("perf"):
        log("perf not found: no time split (apt-get install linux-perf)")
        return None
    data = Path(tempfile.mkdtemp(prefix="bench-perf-")) / "perf.data"
    t = Target(kind, gpus, ctx, interval="1s")
    try:
        t.wait_complete(60)
        time.sleep(2)
        c0 = histogram_totals(t.port)[1]
        rec = subprocess.run(["perf", "record", "-F", "19999", "-g", "-p", str(t.pid), "-o", str(data), "--", "sleep", str(window)],
                             capture_output=True, text=True)
        c1 = histogram_totals(t.port)[1]
    finally:
        t.stop()
    if rec.returncode != 0:
        log(f"perf record failed, no time split: {rec.stderr.strip()[-300:]}")
        shutil.rmtree(data.parent, ignore_errors=True)
        return None
    script = subprocess.run(["perf", "script", "-i", str(data), "-F", "comm,ip,sym,dso"], capture_output=True, text=True).stdout
    shutil.rmtree(data.parent, ignore_errors=True)
    total, inside = perf_split(script, nvml_object(ctx, kind))
    row = dict(target=kind, gpus=gpus, window_s=window, ticks=c1 - c0, samples=total, samples_nvml=inside, nvml_time_share=inside / total if total else None)
    log(f"perf {kind} {gpus} GPUs: {total} samples, NVML {100 * inside / max(total, 1):.1f} % of CPU time")
    return row


def startup(ctx, runs=5):
    rows = []
    for kind in (*ctx.builds, *PEERS):
        for gpus in (8, 64):
            times = []
            for _ in range(runs):
                t = Target(kind, gpus, ctx)
                try:
                    times.append(t.wait_complete(60))
                finally:
                    t.stop()
            rows.append(dict(target=kind, gpus=gpus, runs=times, median_s=statistics.median(times)))
            log(f"startup {kind:8} {gpus:2} GPUs: median {1e3 * rows[-1]['median_s']:.1f} ms")
    return rows


def build_info(exporter, sim):
    """What identifies an exporter build in the results: its paths and the binaries' hashes."""
    digest = lambda path: hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]
    return dict(exporter=str(exporter), sim=str(sim), exporter_sha256=digest(exporter), sim_sha256=digest(sim))


def machine(ctx):
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
    mem = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal"))
    ver = lambda cmd: subprocess.run(cmd, capture_output=True, text=True).stdout + subprocess.run(cmd, capture_output=True, text=True).stderr
    from importlib.metadata import version
    return dict(nproc=os.cpu_count(), cpu=cpu, mem_gib=round(mem / 2**20, 1), kernel=platform.release(),
                loadavg_start=os.getloadavg(), python=platform.python_version(),
                nvitop_exporter=version("nvitop-exporter"), nvidia_ml_py=version("nvidia-ml-py"),
                all_smi=ver([ctx.all_smi, "--version"]).strip(),
                wrk=ver(["wrk", "-v"]).splitlines()[0], nginx=ver(["nginx", "-v"]).strip(),
                valgrind=ver(["valgrind", "--version"]).strip(),
                revision=subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True).stdout.strip())


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--exporter", required=True)
    p.add_argument("--sim", required=True)
    p.add_argument("--all-smi", required=True, help="the all-smi binary (a peer: `cargo install all-smi`)")
    p.add_argument("--scrape-seconds", type=int, default=5, help="each wrk run (default 5)")
    p.add_argument("--footprint-seconds", type=int, default=60, help="the footprint window, and the perf window of the tick phase (default 60)")
    p.add_argument("--profile-seconds", type=int, default=20, help="the callgrind window (default 20)")
    p.add_argument("--attack-seconds", type=int, default=10, help="each attack (default 10)")
    p.add_argument("--only", default="scrape,footprint,ticks,startup,attacks", help="the phases to run (default all: %(default)s)")
    p.add_argument("--out", type=Path, default=BENCH / "results" / f"{datetime.date.today()}.json")
    p.add_argument("--no-pin", action="store_true", help="scrape phase: let wrk and the server share every CPU")
    p.add_argument("--baseline", type=Path, help="a second exporter build to measure side by side in every phase (e.g. main's)")
    p.add_argument("--baseline-sim", type=Path, help="the libnvml_sim.so the baseline loads (default: the one next to it)")
    ctx = p.parse_args()
    # The builds under test, in the order they run: the exporter first, then the baseline.
    ctx.builds = {"exporter": (ctx.exporter, ctx.sim)}
    if ctx.baseline:
        if not ctx.baseline.is_file():
            p.error(f"--baseline {ctx.baseline}: no such file")
        ctx.baseline_sim = ctx.baseline_sim or ctx.baseline.parent / "libnvml_sim.so"
        if not ctx.baseline_sim.is_file():
            p.error(f"{ctx.baseline_sim}: no such file (name the baseline's NVML library with --baseline-sim)")
        ctx.builds["baseline"] = (str(ctx.baseline), str(ctx.baseline_sim))
    elif ctx.baseline_sim:
        p.error("--baseline-sim needs --baseline")
    ctx.scrape_cpus = None if ctx.no_pin else cpu_split()
    ctx.fake_driver = tempfile.mkdtemp(prefix="bench-driver-")
    os.symlink(os.path.abspath(ctx.sim), os.path.join(ctx.fake_driver, "libnvidia-ml.so.1"))
    only = ctx.only.split(",")
    result = dict(date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"), machine=machine(ctx),
                  command=" ".join(sys.argv), settings=dict(scrape_seconds=ctx.scrape_seconds, attack_seconds=ctx.attack_seconds, footprint_seconds=ctx.footprint_seconds, profile_seconds=ctx.profile_seconds,
                                scrape_cpus=dict(zip(("server", "wrk"), ctx.scrape_cpus)) if ctx.scrape_cpus else None))
    if ctx.baseline:
        result["builds"] = {kind: build_info(*paths) for kind, paths in ctx.builds.items()}
    if "scrape" in only:
        result["scrape"], result["exposition"] = scrape_cost(ctx)
    if "footprint" in only:
        result["footprint"] = footprint(ctx)
    if "ticks" in only:
        # The builds alternate at each size, so that a drift in the machine's load touches both.
        result["tick_profile"] = [tick_profile(ctx, g, ctx.profile_seconds, kind) for g in (8, 64) for kind in ctx.builds]
        splits = [time_profile(ctx, g, ctx.footprint_seconds, kind) for g in (8, 64) for kind in ctx.builds]
        if all(splits):
            result["time_profile"] = splits
    if "startup" in only:
        result["startup"] = startup(ctx)
    if "attacks" in only:
        result["attacks"] = attacks.attacks(ctx, Target, Nginx, fetch, log, ctx.attack_seconds)
    result["machine"]["loadavg_end"] = os.getloadavg()
    shutil.rmtree(ctx.fake_driver, ignore_errors=True)
    ctx.out.parent.mkdir(parents=True, exist_ok=True)
    ctx.out.write_text(json.dumps(result, indent=1) + "\n")
    log(f"wrote {ctx.out}")


if __name__ == "__main__":
    main()
