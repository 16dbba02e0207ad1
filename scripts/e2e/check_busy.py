#!/usr/bin/env python3
"""Checks the busy-time counters against a live Prometheus that scrapes every 7.5 s.

    check_busy.py --prometheus URL --job JOB --epoch UNIX_SECONDS -- EXPORTER COMMAND...

What a user runs, 15 s scrapes, `rate()[5m]` and a 1 s interval against a job busy 3 s in every
10, checked at half its time scale: 7.5 s scrapes, `rate()[150s]`, a 0.5 s interval (the
exporter's command) and a job busy 1.5 s in every 5. Every ratio the result depends on stays: 19
scrape intervals in a window, 28.5 periods, 10 ticks a period, a scrape every 1.5 periods. What
does not scale is the restart's second or so, here twice the share of the window it is at 5
minutes.

The exporter runs nvml-sim/scenarios/idle-waste.toml with NVML_SIM_EPOCH=UNIX_SECONDS, so the
script knows the simulated load at every instant: GPU 0 busy for the first 1.5 s of every 5,
GPUs 1-3 idle, all four held by one pod of the fake kubelet. After 150 s of scrapes, with a kill
and restart of the exporter halfway:

- `rate()` over 150 s of GPU 0's utilization and SM-active counters is within 2 % of the true
  mean over the time it averages. At 7.5 s scrapes a 150 s window spans 19 scrape intervals,
  142.5 s: 28.5 periods, whose true mean is 0.2947 to 0.3053 depending on where the scrapes fall
  (0.30 only over whole periods). The script computes it from the scenario's schedule and the
  ticks of the first and last samples in the window (nvml_exporter_last_sample_timestamp_seconds
  scraped with them), and prints the distance to 0.30 as well. Each scrape sees one tick in
  fifteen; the gauge as scraped (avg_over_time) is printed next to it, for comparison.
- The restart is one counter reset in the window (`resets()`), which `rate()` absorbs. It is
  made right after a scrape while GPU 0 is idle, so it loses no busy time: a counter loses what
  it gained since the last scrape before a reset, and the exporter measures nothing while it is
  down. Killed rather than stopped, so that a graceful shutdown's wait for open connections is
  not part of what is measured.
- The pod is charged 4 GPU-seconds a second (less the restart's second or so), 3.6 to 3.7 of
  them idle (GPU 0 is idle 3.5 s of every 5, less at most one tick per transition: a tick whose
  interval holds a busy edge is not idle) and 0.30 SM-active; one increase() query gives idle
  GPU-hours per namespace.

Run by scripts/e2e-busy.sh, which starts Prometheus (scraping JOB every 7.5 s) and the kubelet.
"""

import argparse
import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request

PERIOD, BUSY = 5.0, 1.5  # idle-waste.toml's GPU 0
TRUE_MEAN = BUSY / PERIOD
TOLERANCE = 0.02  # relative
WINDOW = "150s"
WINDOW_S = 150
SCRAPE_S = 7.5
# The restart is made at a scrape with GPU 0 idle for at least this long after it: the scrapes
# fall at two phases of the period, 2.5 s apart, and one of them is always between the end of
# the busy part and this long before the next.
RESTART_S = PERIOD - BUSY - 2.5


class Prometheus:
    def __init__(self, base):
        self.base = base.rstrip("/")
        self.at = None  # evaluation time of instant queries; None: now

    def get(self, path, **params):
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {body}")
        return body["data"]

    def result(self, expr):
        params = {"query": expr}
        if self.at is not None:
            params["time"] = self.at
        return self.get("/api/v1/query", **params)["result"]

    def query(self, expr):
        """An instant query: {gpu label: value}."""
        return {s["metric"].get("gpu", ""): float(s["value"][1]) for s in self.result(expr)}

    def target(self, job):
        """The active target of `job`, or None before Prometheus has loaded it."""
        for t in self.get("/api/v1/targets", state="active")["activeTargets"]:
            if t["labels"].get("job") == job:
                return t
        return None


def wait_for(what, predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(0.1)
    sys.exit(f"FAIL: timed out after {timeout} s waiting for {what}")


def last_scrape(prom, job):
    """When the last successful scrape of `job` was (Prometheus's text), or None."""
    t = prom.target(job)
    return t["lastScrape"] if t is not None and t["health"] == "up" else None


def busy_until(t):
    """Busy seconds of GPU 0 from simulated t = 0 to t."""
    whole, part = divmod(t, PERIOD)
    return whole * BUSY + min(part, BUSY)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prometheus", required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--epoch", type=float, required=True, help="NVML_SIM_EPOCH of the exporter")
    p.add_argument("command", nargs="+", help="the exporter's command line (after --)")
    args = p.parse_args()
    prom = Prometheus(args.prometheus)
    sel = f'job="{args.job}"'

    failures = []

    def check(name, ok, detail):
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
        if not ok:
            failures.append(name)

    def phase():
        return (time.time() - args.epoch) % PERIOD

    exporter = subprocess.Popen(args.command)
    try:
        first = wait_for("a first successful scrape", lambda: last_scrape(prom, args.job), 60)
        start = time.monotonic()
        print(f"first scrape at {first}; restarting the exporter about {WINDOW_S // 2} s in")

        # Halfway, right after a scrape, with GPU 0 idle for the next RESTART_S (1 s) at least: a
        # restart and the restarted exporter's first tick take a fraction of that.
        time.sleep(WINDOW_S / 2)
        for _ in range(4):
            seen = last_scrape(prom, args.job)
            wait_for("the next scrape", lambda: last_scrape(prom, args.job) not in (None, seen), 30)
            if BUSY <= phase() <= PERIOD - RESTART_S:
                break
        else:
            sys.exit("FAIL: no scrape fell where GPU 0 stays idle long enough for a restart")
        exporter.kill()
        exporter.wait(timeout=10)
        exporter = subprocess.Popen(args.command)
        restarted = f"resets(nvidia_gpu_utilization_seconds_total{{{sel},gpu=\"0\"}}[{WINDOW}])"
        wait_for("a scrape of the restarted exporter", lambda: prom.query(restarted).get("0", 0) >= 1, 60)

        # The whole window after the first scrape, and one scrape more; every query at one instant.
        remaining = start + WINDOW_S + SCRAPE_S - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)
        prom.at = time.time()

        # The ticks of the first and last samples in the window: what rate() averages over.
        ticks = prom.result(f"nvml_exporter_last_sample_timestamp_seconds{{{sel}}}[{WINDOW}]")
        values = [float(v) for _, v in ticks[0]["values"]] if ticks else []
        if len(values) < 2:
            sys.exit(f"FAIL: fewer than two samples in the window: {ticks}")
        t1, t2 = values[0] - args.epoch, values[-1] - args.epoch
        span_mean = (busy_until(t2) - busy_until(t1)) / (t2 - t1)
        print(f"the window's samples span {t2 - t1:.1f} s of ticks; GPU 0's true mean over them: {span_mean:.4f}")

        for family in ["nvidia_gpu_utilization_seconds_total", "nvidia_gpu_sm_active_seconds_total"]:
            rates = prom.query(f"rate({family}{{{sel}}}[{WINDOW}])")
            got = rates.get("0")
            check(
                f"rate({family}[{WINDOW}]) of the 1.5-in-5 s GPU",
                got is not None and abs(got - span_mean) <= TOLERANCE * span_mean,
                f"{got} (true mean over the window {span_mean:.4f}, within {TOLERANCE:.0%}; "
                f"{(got or 0) / TRUE_MEAN - 1:+.2%} from {TRUE_MEAN})",
            )
            idle = {g: v for g, v in rates.items() if g != "0"}
            check(
                f"rate({family}[{WINDOW}]) of the idle GPUs",
                sorted(idle) == ["1", "2", "3"] and all(v == 0 for v in idle.values()),
                str(idle),
            )
        resets = prom.query(f"resets(nvidia_gpu_utilization_seconds_total{{{sel}}}[{WINDOW}])")
        check("the restart is one counter reset in the window", resets.get("0") == 1, str(resets))

        pod = f'{sel},namespace="ml",pod="waste-0"'
        expected = {
            "nvidia_gpu_pod_gpu_seconds_total": (4.0, 4.0),
            "nvidia_gpu_pod_idle_gpu_seconds_total": (3.0 + 0.6, 3.0 + 0.7),
            "nvidia_gpu_pod_sm_active_gpu_seconds_total": (span_mean, span_mean),
        }
        for family, (low, high) in expected.items():
            got = prom.query(f"sum(rate({family}{{{pod}}}[{WINDOW}]))").get("")
            check(
                f"the pod's rate({family}[{WINDOW}]) over its four GPUs",
                got is not None and low * (1 - TOLERANCE) <= got <= high * (1 + TOLERANCE),
                f"{got} GPU-seconds a second (want {low:.4f} to {high:.4f}, within {TOLERANCE:.0%})",
            )
        idle0 = prom.query(f'rate(nvidia_gpu_pod_idle_gpu_seconds_total{{{pod},gpu="0"}}[{WINDOW}])').get("0")
        check(
            "GPU 0's idle share: 3.5 s in 5, less one tick per transition at most",
            idle0 is not None and 0.6 * (1 - TOLERANCE) <= idle0 <= 0.7 * (1 + TOLERANCE),
            str(idle0),
        )
        hours = f"sum by (namespace) (increase(nvidia_gpu_pod_idle_gpu_seconds_total{{{sel}}}[{WINDOW}])) / 3600"
        per_namespace = prom.result(hours)
        print(f"idle GPU-hours per namespace over {WINDOW} (the 30-day query with [{WINDOW}]): "
              + ", ".join(f"{r['metric'].get('namespace')}={float(r['value'][1]):.4f}" for r in per_namespace))
        check(
            "one increase() query gives idle GPU-hours per namespace",
            [r["metric"].get("namespace") for r in per_namespace] == ["ml"],
            str(per_namespace),
        )
        gauge = prom.query(f'avg_over_time(nvidia_gpu_utilization_ratio{{{sel},gpu="0"}}[{WINDOW}])')
        print(f"for comparison, the gauge as scraped: avg_over_time(nvidia_gpu_utilization_ratio[{WINDOW}]) = {gauge.get('0')}")
    finally:
        exporter.kill()
        exporter.wait(timeout=10)

    if failures:
        sys.exit(f"FAIL ({len(failures)}): {'; '.join(failures)}")
    print("busy-time counters: PASS")


if __name__ == "__main__":
    main()
