#!/usr/bin/env python3
"""Soak run: the release exporter on the faults scenario
(nvml-sim/scenarios/faults.toml: init failures, a lost GPU, 30 s hangs, error bursts, an XID storm,
driver restarts, repeating every simulated minute) at a 10 ms interval for at least 10 000 ticks,
while wrk scrapes /metrics without pause (gzip, at least 100 000 scrapes). VmRSS is read from
/proc every second. The warm-up is one whole fault cycle (faults.toml repeats every 60 s; until each
fault has happened once, buffers and threads are still reaching their working size); the 10 000
ticks are counted after it. It passes when the resident memory at the end is within 10 % of what
it was after the warm-up, and the process is still serving.

    bench/soak.py --exporter target/release/nvml-exporter --sim target/release/libnvml_sim.so

Writes bench/results/soak-<date>.json and prints its row for the soak line of BENCHMARKS.md.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import BENCH, ROOT, fetch, free_port, histogram_totals, log, proc_sample, wrk  # noqa: E402


def nvml_up(port):
    try:
        return b"nvml_exporter_nvml_up 1" in fetch(port, timeout=2)[1]
    except OSError:
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exporter", required=True)
    ap.add_argument("--sim", required=True)
    ap.add_argument("--ticks", type=int, default=10_000)
    ap.add_argument("--scrapes", type=int, default=100_000)
    ap.add_argument("--warmup-seconds", type=float, default=65.0, help="one fault cycle (60 s) and a margin")
    ap.add_argument("--out", default=str(BENCH / "results" / f"soak-{datetime.date.today()}.json"))
    args = ap.parse_args()

    port = free_port()
    logs = tempfile.NamedTemporaryFile(prefix="soak-", suffix=".log", delete=False)
    env = dict(os.environ, NVML_SIM_SCENARIO=str(ROOT / "nvml-sim/scenarios/faults.toml"))
    env.pop("NVML_SIM_TIME", None)
    cmd = [args.exporter, "--nvml-lib", args.sim, "--interval", "10ms", "--stale-grace", "1s",
           "--listen", f"127.0.0.1:{port}", "--log-level", "warn"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=logs)
    rss = []  # (seconds since start, ticks, VmRSS KiB)
    scrapes = 0
    started = time.monotonic()
    try:
        while not nvml_up(port):  # faults.toml fails NVML init for its first 3 s
            if time.monotonic() - started > 30:
                raise SystemExit("NVML never came up")
            time.sleep(0.2)
        baseline = None
        warm_ticks = 0
        up_at = time.monotonic()
        while True:
            _, ticks = histogram_totals(port)
            _, kib, _, _ = proc_sample(proc.pid)
            rss.append((round(time.monotonic() - started, 1), int(ticks), kib))
            if baseline is None and time.monotonic() - up_at >= args.warmup_seconds:
                baseline, warm_ticks, scrapes = kib, int(ticks), 0
                log(f"soak: warm-up done at {int(ticks)} ticks, VmRSS {kib} KiB")
            if baseline is not None and ticks - warm_ticks >= args.ticks and scrapes >= args.scrapes:
                break
            if proc.poll() is not None:
                raise SystemExit(f"exporter exited with {proc.returncode}")
            # One second of scraping between samples (gzip, as Prometheus asks).
            r = wrk(port, 8, 1, True)
            if r["errors"]:
                raise SystemExit(f"scrape errors: {r}")
            scrapes += r["requests"]
        final = rss[-1][2]
        peak = max(k for _, t, k in rss if t >= warm_ticks)
        growth = (final - baseline) / baseline
        with open(logs.name) as f:
            log_lines = sum(1 for _ in f)
        result = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(cmd),
            "scenario": "nvml-sim/scenarios/faults.toml",
            "warmup_ticks": warm_ticks,
            "ticks": rss[-1][1] - warm_ticks,
            "scrapes": scrapes,
            "seconds": rss[-1][0],
            "rss_after_warmup_kib": baseline,
            "rss_final_kib": final,
            "rss_peak_kib": peak,
            "growth": round(growth, 4),
            "log_lines": log_lines,
            "pass": abs(growth) <= 0.10,
            "samples": rss,
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"| {result['ticks']} ticks at 10 ms after a {warm_ticks}-tick warm-up, {scrapes} gzip scrapes, {result['seconds']:.0f} s in all, faults.toml "
              f"| VmRSS after warm-up {baseline / 1024:.1f} MiB, final {final / 1024:.1f} MiB, peak {peak / 1024:.1f} MiB "
              f"| {growth * 100:+.1f} % | {'PASS' if result['pass'] else 'MISS'} |")
        print(f"log lines: {log_lines}; results: {args.out}")
        return 0 if result["pass"] else 1
    finally:
        proc.terminate()
        proc.wait(10)
        os.unlink(logs.name)


if __name__ == "__main__":
    sys.exit(main())
