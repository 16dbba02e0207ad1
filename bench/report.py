#!/usr/bin/env python3
"""Turns a bench/results/<date>.json into the Markdown tables of BENCHMARKS.md, with each target
of the issue marked PASS or MISS.

    python3 bench/report.py bench/results/2025-01-01.json > bench/results/2025-01-01.md
"""

import json
import sys


def pick(rows, **kw):
    return next(r for r in rows if all(r.get(k) == v for k, v in kw.items()))


def verdict(ok):
    return "PASS" if ok else "**MISS**"


def targets(res):
    """[(target, measured, verdict)] for every target of the issue the run covers."""
    out = []
    sc, fp, tp = res.get("scrape"), res.get("footprint"), res.get("tick_profile")
    if sc:
        for enc in ("plain", "gzip"):
            for gpus in (8, 64):
                e = pick(sc, target="exporter", gpus=gpus, encoding=enc, conns=16)["rps"]
                n = pick(sc, target="nginx", gpus=gpus, encoding=enc, conns=16)["rps"]
                out.append((f"≥ 50 % of nginx throughput, 16 clients, {gpus} GPUs, {enc}", f"{100 * e / n:.0f} % ({e:.0f} vs {n:.0f} req/s)", verdict(e / n >= 0.5)))
        for enc in ("plain", "gzip"):
            for gpus in (8, 64):
                e = pick(sc, target="exporter", gpus=gpus, encoding=enc, conns=16)["rps"]
                p = pick(sc, target="python", gpus=gpus, encoding=enc, conns=16)["rps"]
                out.append((f"≥ 20× Python's throughput, 16 clients, {gpus} GPUs, {enc}", f"{e / p:.0f}× ({e:.0f} vs {p:.1f} req/s)", verdict(e / p >= 20)))
        for enc in ("plain", "gzip"):
            r = pick(sc, target="exporter", gpus=8, encoding=enc, conns=64)
            out.append((f"p99 ≤ 5 ms, 64 clients, 8 GPUs, {enc}", f"{r['p99_us'] / 1e3:.2f} ms", verdict(r["p99_us"] <= 5000 and r["errors"] == 0)))
    if fp:
        for gpus in (1, 8, 64):
            e = pick(fp, target="exporter", gpus=gpus, scrape="1/s")["rss_max_mib"]
            p = pick(fp, target="python", gpus=gpus, scrape="1/s")["rss_max_mib"]
            out.append((f"RSS ≤ 1/4 of Python's, {gpus} GPUs, 1/s scrape", f"{e:.1f} vs {p:.1f} MiB (1/{p / e:.1f})", verdict(e <= p / 4)))
            er, pr = (pick(fp, target=t, gpus=gpus, scrape="1/s") for t in ("exporter", "python"))
            if "rss_anon_max_mib" in er:
                # The part a process's own code owns, without the executable and shared libraries.
                ea, pa = er["rss_anon_max_mib"], pr["rss_anon_max_mib"]
                out.append((f"  of which anonymous (heap, stacks), {gpus} GPUs", f"{ea:.1f} vs {pa:.1f} MiB (1/{pa / ea:.1f})", verdict(ea <= pa / 4)))
        for scrape in ("idle", "1/s"):
            r = pick(fp, target="exporter", gpus=8, scrape=scrape)
            out.append((f"8 GPUs at 1 s, {scrape}: RSS ≤ 16 MiB", f"max {r['rss_max_mib']:.1f} MiB", verdict(r["rss_max_mib"] <= 16)))
            out.append((f"8 GPUs at 1 s, {scrape}: CPU ≤ 0.5 % of a core", f"{100 * r['cpu_share']:.2f} %", verdict(r["cpu_share"] <= 0.005)))
    if fp and tp:
        r = pick(fp, target="exporter", gpus=8, scrape="idle")
        prof = pick(tp, gpus=8)
        own = r["cpu_per_tick_per_gpu_s"] * (1 - prof["nvml_share"])
        out.append(("exporter work per GPU per tick ≤ 50 µs (8 GPUs, NVML excluded by instruction share)", f"{own * 1e6:.1f} µs", verdict(own <= 50e-6)))
        if res.get("time_profile"):
            split = pick(res["time_profile"], gpus=8)
            own = r["cpu_per_tick_per_gpu_s"] * (1 - split["nvml_time_share"])
            out.append(("exporter work per GPU per tick ≤ 50 µs (8 GPUs, NVML excluded by perf time share)", f"{own * 1e6:.1f} µs", verdict(own <= 50e-6)))
    out.append(("RSS after the reliability soak within 10 % of start", "not in this harness (the soak belongs to the reliability issue)", "NOT MEASURED"))
    return out


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def main():
    res = json.load(open(sys.argv[1]))
    m = res["machine"]
    print(f"Run {res['date']}, revision `{m['revision']}`: {m['nproc']} CPUs ({m['cpu']}), {m['mem_gib']} GiB, "
          f"Linux {m['kernel']}, load average {m['loadavg_start'][0]:.2f} at start, {m['loadavg_end'][0]:.2f} at end. "
          f"{m['wrk']}; {m['nginx']}; Python {m['python']}, prometheus_client {m['prometheus_client']}, nvidia-ml-py {m['nvidia_ml_py']}.\n")
    print(f"Command: `{res['command']}`\n")
    print("### Targets\n")
    print(table(["target", "measured", "verdict"], targets(res)))
    if "scrape" in res:
        print("\n### Scrape cost (wrk, requests/s and latency)\n")
        pins = res["settings"].get("scrape_cpus")
        print(f"Servers on CPUs {pins['server']}, wrk on CPUs {pins['wrk']} (one wrk thread per CPU).\n" if pins
              else "wrk and the servers share every CPU.\n")
        rows = []
        for r in res["scrape"]:
            n = pick(res["scrape"], target="nginx", gpus=r["gpus"], encoding=r["encoding"], conns=r["conns"])["rps"]
            rows.append([r["target"], r["gpus"], r["encoding"], r["body_bytes"], r["conns"], f"{r['rps']:.0f}", f"{r['p50_us'] / 1e3:.2f}", f"{r['p99_us'] / 1e3:.2f}", f"{r['rps'] / n:.3f}", r["errors"]])
        print(table(["server", "GPUs", "encoding", "body bytes", "clients", "req/s", "p50 ms", "p99 ms", "÷ nginx", "errors"], rows))
    if "footprint" in res:
        print(f"\n### Footprint ({res['settings']['footprint_seconds']} s at 1 s, all twelve processes in parallel)\n")
        rows = [[r["target"], r["gpus"], r["scrape"], f"{r['rss_start_mib']:.1f}", f"{r['rss_max_mib']:.1f}", f"{r['rss_end_mib']:.1f}",
                 f"{r['rss_anon_max_mib']:.1f}" if "rss_anon_max_mib" in r else "", f"{r['rss_file_max_mib']:.1f}" if "rss_file_max_mib" in r else "",
                 f"{100 * r['cpu_share']:.3f}"] for r in res["footprint"]]
        print(table(["process", "GPUs", "scrapes", "RSS start MiB", "RSS max MiB", "RSS end MiB", "anon max MiB", "file max MiB", "CPU % of a core"], rows))
    if "footprint" in res and "tick_profile" in res:
        print("\n### Tick cost\n")
        rows = []
        for prof in res["tick_profile"]:
            r = pick(res["footprint"], target="exporter", gpus=prof["gpus"], scrape="idle")
            cpu = r["cpu_per_tick_per_gpu_s"]
            rows.append([prof["gpus"], f"{r['tick_wall_s'] * 1e3:.2f}", f"{r['tick_wall_per_gpu_s'] * 1e6:.1f}", f"{cpu * 1e6:.1f}",
                         f"{100 * prof['nvml_share']:.1f}", f"{cpu * prof['nvml_share'] * 1e6:.1f}", f"{cpu * (1 - prof['nvml_share']) * 1e6:.1f}",
                         f"{prof['ir_exporter_per_tick_per_gpu']:.0f}"])
        print(table(["GPUs", "tick wall ms (histogram)", "wall per GPU µs", "process CPU per tick per GPU µs", "NVML share of instructions %",
                     "NVML µs per GPU", "exporter µs per GPU", "exporter instructions per tick per GPU"], rows))
        if res.get("time_profile"):
            print("\nThe same split by time: the share of `perf` CPU-clock samples whose call stack is inside NVML (kernel time "
                  "included, charged to whoever's stack it is on).\n")
            rows = []
            for split in res["time_profile"]:
                r = pick(res["footprint"], target="exporter", gpus=split["gpus"], scrape="idle")
                cpu, share = r["cpu_per_tick_per_gpu_s"], split["nvml_time_share"]
                rows.append([split["gpus"], split["samples"], f"{100 * share:.1f}", f"{cpu * share * 1e6:.1f}", f"{cpu * (1 - share) * 1e6:.1f}"])
            print(table(["GPUs", "perf samples", "NVML share of CPU time %", "NVML µs per GPU", "exporter µs per GPU"], rows))
        for prof in res["tick_profile"]:
            print(f"\nSelf cost, top functions ({prof['gpus']} GPUs, callgrind, {prof['ticks']:.0f} ticks):\n\n```text")
            print("\n".join(prof["top_self"][:15]))
            print("```")
    if "startup" in res:
        print("\n### Startup (exec → first /metrics with every GPU up)\n")
        rows = [[r["target"], r["gpus"], f"{r['median_s'] * 1e3:.1f}", ", ".join(f"{t * 1e3:.0f}" for t in r["runs"])] for r in res["startup"]]
        print(table(["process", "GPUs", "median ms", "runs ms"], rows))


if __name__ == "__main__":
    main()
