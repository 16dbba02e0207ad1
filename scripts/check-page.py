#!/usr/bin/env python3
"""The node page in a real browser: Debian's chromium, headless, driven through the DevTools
protocol, against the exporter's demo (8 H100s) and the MIG scenario.

For each: the DOM after load shows every GPU (and MIG instance) with the readings /api/v1/gpus
gives at the same tick (each field of docs/node-page.md: its number, or its flag) and the marks
the alert rules define; the page refreshes itself in place
(no reload) to the next tick, and on the demo, whose power readings move, a value that changed
shows its new number; every request the page makes goes to
127.0.0.1; nothing is logged as an error (console, exceptions, CSP, failed loads); it still shows
every GPU with JavaScript off, fits a phone's width and turns dark with prefers-color-scheme.
A screenshot of each is written: node-page.png (the demo) and node-page-mig.png.

Usage: check-page.py EXPORTER [--screenshots DIR]   (DIR: target/node-page; docs/images to
update the README's). EXPORTER is the exporter binary with libnvml_sim.so next to it (--demo).
Needs chromium (Debian) and websocket-client (PyPI).
"""

import argparse
import base64
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import websocket  # websocket-client

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEADLINE_S = 20


def poll(what, condition, timeout=DEADLINE_S, every=0.2):
    """condition() until it returns something true; fails naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


class Exporter:
    """The exporter on 127.0.0.1 and a port the OS picks, on the simulator."""

    def __init__(self, binary, scenario=None):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("NVML_EXPORTER_", "NVML_SIM_"))}
        if scenario:
            env["NVML_SIM_SCENARIO"] = os.path.join(ROOT, "nvml-sim/scenarios", scenario)
        # The demo's XID 79 (GPU 6, t = 30 s) comes a few seconds in, so the picture has a
        # failed GPU with its action.
        env["NVML_SIM_START"] = "27"
        # The node's name on the page, as the downward API would give it.
        env["NODE_NAME"] = "gpu-node-1"
        self.proc = subprocess.Popen(
            [binary, "--demo", "--listen", "127.0.0.1:0", "--log-format", "json"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.base = None
        found = threading.Event()

        def read():
            for line in self.proc.stderr:
                m = re.search(r'"address":"([^"]+)"', line)
                if m and "listening" in line and not found.is_set():
                    self.base = f"http://{m.group(1)}"
                    found.set()

        threading.Thread(target=read, daemon=True).start()
        if not found.wait(30):
            self.stop()
            raise AssertionError("the exporter did not start listening")

    def json(self, path):
        with urllib.request.urlopen(self.base + path, timeout=5) as r:
            return json.load(r)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Browser:
    """Headless chromium with one page, and what that page logged and requested."""

    def __init__(self):
        self.profile = tempfile.mkdtemp(prefix="check-page-")
        chromium = shutil.which("chromium") or "chromium"
        self.proc = subprocess.Popen(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--no-first-run", "--no-default-browser-check", "--disable-extensions",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--remote-debugging-port=0", f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        poll("chromium's DevTools port", lambda: os.path.exists(port_file)
             and len(open(port_file).read().split()) == 2)
        port, path = open(port_file).read().split()
        self.ws = websocket.create_connection(f"ws://127.0.0.1:{port}{path}", timeout=30)
        self.next_id = 0
        self.events = []
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget",
                                 {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Network", "Log"):
            self.send(f"{domain}.enable")

    def call(self, method, params=None, session=None):
        """Sends a command and returns its result, keeping the events that come meanwhile."""
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self.ws.send(json.dumps(message))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise AssertionError(f"{method}: {reply['error']}")
                return reply["result"]
            if "method" in reply:
                self.events.append(reply)

    def send(self, method, params=None):
        """A command to the page."""
        return self.call(method, params, self.session)

    def evaluate(self, expression):
        result = self.send("Runtime.evaluate",
                           {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open(self, url, width=1280, height=900):
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600})
        self.send("Page.navigate", {"url": url})
        poll("the page to load", lambda: self.evaluate(
            "document.readyState === 'complete' && !!document.getElementById('node')"))

    def screenshot(self, path):
        height = self.evaluate("document.documentElement.scrollHeight")
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": 1280, "height": height, "deviceScaleFactor": 1, "mobile": False})
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def drain(self):
        """Takes the events that arrived while nothing was asked."""
        self.ws.settimeout(0.1)
        try:
            while True:
                reply = json.loads(self.ws.recv())
                if "method" in reply:
                    self.events.append(reply)
        except websocket.WebSocketTimeoutException:
            pass
        finally:
            self.ws.settimeout(30)

    def requests(self):
        self.drain()
        return [e["params"]["request"]["url"] for e in self.events
                if e["method"] == "Network.requestWillBeSent"]

    def errors(self):
        self.drain()
        found = []
        for e in self.events:
            p = e.get("params", {})
            if e["method"] == "Runtime.exceptionThrown":
                found.append(p["exceptionDetails"].get("text", "exception"))
            elif e["method"] == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert"):
                found.append(" ".join(str(a.get("value", a.get("description"))) for a in p["args"]))
            elif e["method"] == "Log.entryAdded" and p["entry"]["level"] == "error":
                found.append(f'{p["entry"]["source"]}: {p["entry"]["text"]} {p["entry"].get("url", "")}')
            elif e["method"] == "Network.loadingFailed":
                found.append(f'load failed: {p.get("errorText")}')
        return found

    def close(self):
        try:
            self.call("Browser.close")
        except Exception:
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)


# What the DOM shows: the tick, and for each GPU card (and MIG instance) its state, marks, the
# numbers of its readings (data-field / data-value, as /api/v1/gpus names them) and its flags.
DOM = """(() => {
  const fields = el => Object.fromEntries([...el.querySelectorAll(':scope > table [data-field], :scope > p [data-field]')]
      .map(f => [f.dataset.field, f.dataset.value]));
  const flags = el => el.querySelector(':scope > p.flags')?.innerText || '';
  return {
    tick: document.getElementById('node').dataset.tick,
    marker: window.checkPageMarker || null,
    gpus: [...document.querySelectorAll('article.gpu')].map(a => ({
      gpu: a.dataset.gpu, state: a.dataset.state, marks: a.dataset.marks,
      text: a.innerText, values: fields(a), flags: flags(a),
      instances: [...a.querySelectorAll('article.instance')].map(i => ({
        id: i.dataset.gpuInstance, marks: i.dataset.marks, text: i.innerText, values: fields(i),
        flags: flags(i)})),
    })),
  };
})()"""



def page_fields():
    """The page's readings, from the table docs/node-page.md renders from src/page/fields.rs:
    the fields shown as a number (in a data-field) and, by field, the words of each flag."""
    numbers, flags = [], {}
    with open(os.path.join(ROOT, "docs/node-page.md")) as doc:
        for line in doc:
            row = re.match(r"^\| `(\w+)` \| `\w+` \| (.+) \|$", line)
            if row:
                flag = re.match(r"flag \*(.+?)\*", row.group(2))
                if flag:
                    flags[row.group(1)] = flag.group(1)
                else:
                    numbers.append(row.group(1))
    assert numbers and flags, "no fields read from docs/node-page.md"
    return numbers, flags


NUMBERS, FLAGS = page_fields()


def same_numbers(where, card, view):
    """The card (GPU or instance, from DOM) shows the JSON view's numbers and flags."""
    for field in NUMBERS:
        want = view.get(field)
        got = card["values"].get(field)
        if want is None:
            assert got is None, f"{where} {field}: the page shows {got}, the JSON none"
        else:
            assert got is not None and float(got) == want, f"{where} {field}: page {got}, JSON {want}"
    for field, words in FLAGS.items():
        shown = words in card["flags"]
        assert shown == (view.get(field) is True), f"{where} {field}: page {shown}, JSON {view.get(field)}"


def dom_and_json_of_one_tick(browser, exporter):
    """The DOM and the JSON of the tick the DOM shows (JSON fetched until one matches)."""
    seen = {}

    def matched():
        view = exporter.json("/api/v1/gpus")
        seen[repr(view["last_tick_timestamp_seconds"])] = view
        dom = browser.evaluate(DOM)
        for tick, view in seen.items():
            if float(dom["tick"]) == float(tick):
                return dom, view
        return None

    return poll("the DOM and /api/v1/gpus at the same tick", matched)


def check_node(binary, scenario, screenshot, expect_marks, values_change):
    """Checks the page of `scenario` (None: the demo), whose marks are `expect_marks`; with
    `values_change`, some number changes from tick to tick and a refresh must show it."""
    exporter = Exporter(binary, scenario)
    browser = Browser()
    try:
        poll("GPM values", lambda: any(g.get("sm_active") is not None or any(
            i.get("sm_active") is not None for i in g["mig_instances"])
            for g in exporter.json("/api/v1/gpus")["gpus"]))
        browser.open(exporter.base + "/")
        browser.evaluate("window.checkPageMarker = 'loaded once'")
        dom, view = dom_and_json_of_one_tick(browser, exporter)
        assert len(dom["gpus"]) == len(view["gpus"]) > 0, dom
        for card, gpu in zip(dom["gpus"], view["gpus"]):
            where = f"{scenario or 'demo'} GPU {gpu['gpu']}"
            assert card["gpu"] == str(gpu["gpu"]) and card["state"] == gpu["state"], where
            assert gpu["name"] in card["text"] and gpu["uuid"] in card["text"], where
            assert card["marks"] == " ".join(gpu["marks"]), f"{where}: {card['marks']} {gpu['marks']}"
            for mark in gpu["marks"]:
                assert "▲ " + mark.replace("_", ", ", 1).replace("_", " ") in card["text"], where
            if gpu["health"]:
                assert gpu["health"]["state"] in card["text"], where
            same_numbers(where, card, gpu)
            assert len(card["instances"]) == len(gpu["mig_instances"]), where
            for shown, instance in zip(card["instances"], gpu["mig_instances"]):
                w = f"{where} instance {instance['gpu_instance']}"
                assert shown["id"] == str(instance["gpu_instance"]), w
                assert instance["profile"] in shown["text"], w
                assert shown["marks"] == " ".join(instance["marks"]), w
                same_numbers(w, shown, instance)
        marks = {(g["gpu"], i): m for g in view["gpus"]
                 for i, m in [(None, g["marks"])] + [(x["gpu_instance"], x["marks"])
                                                     for x in g["mig_instances"]] if m}
        assert marks == expect_marks, f"marks {marks}, expected {expect_marks}"

        # The page refreshes itself in place, and a value that changed shows its new number.
        first = dom

        def refreshed():
            now = browser.evaluate(DOM)
            if now["tick"] == first["tick"]:
                return None
            changed = [(a["gpu"], f) for a, b in zip(first["gpus"], now["gpus"])
                       for f in NUMBERS if a["values"].get(f) != b["values"].get(f)]
            return (now, changed) if changed or not values_change else None

        now, changed = poll("a refresh" + (" that shows a changed value" if values_change else ""),
                            refreshed)
        assert now["marker"] == "loaded once", "the page was reloaded instead of refreshed"
        dom, view = dom_and_json_of_one_tick(browser, exporter)
        for card, gpu in zip(dom["gpus"], view["gpus"]):
            same_numbers(f"after a refresh, GPU {gpu['gpu']}", card, gpu)

        browser.screenshot(screenshot)

        # Readable on a phone (nothing wider than the screen), dark with the system, and whole
        # without JavaScript (the server renders it).
        browser.open(exporter.base + "/", width=390, height=844)
        overflow = browser.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"the page is {overflow} px wider than a 390 px phone"
        browser.send("Emulation.setEmulatedMedia",
                     {"features": [{"name": "prefers-color-scheme", "value": "dark"}]})
        background = browser.evaluate("getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(13, 17, 23)", f"dark mode background {background}"
        browser.send("Emulation.setEmulatedMedia", {"features": []})
        browser.send("Emulation.setScriptExecutionDisabled", {"value": True})
        browser.open(exporter.base + "/")
        cards = browser.evaluate("document.querySelectorAll('article.gpu [data-field=utilization], "
                                 "article.gpu [data-field=memory_used_bytes]').length")
        assert cards >= len(view["gpus"]), f"without JavaScript: {cards} values"
        browser.send("Emulation.setScriptExecutionDisabled", {"value": False})

        requests = browser.requests()
        refreshes = [u for u in requests if u == exporter.base + "/"]
        assert len(refreshes) >= 3, f"the page was fetched {len(refreshes)} times: {requests}"
        assert exporter.base + "/page.js" in requests, requests
        elsewhere = [u for u in requests if not u.startswith(exporter.base + "/")]
        assert not elsewhere, f"requests beyond {exporter.base}: {elsewhere}"
        errors = browser.errors()
        assert not errors, f"errors logged: {errors}"
        print(f"{scenario or 'demo'}: {len(view['gpus'])} GPUs, marks {sorted(marks.items(), key=str)}, "
              f"{len(requests)} requests all to 127.0.0.1, a refresh changed {changed[:3]}, "
              f"no console error; {screenshot}")
    finally:
        browser.close()
        exporter.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("exporter")
    parser.add_argument("--screenshots", default=os.path.join(ROOT, "target/node-page"))
    args = parser.parse_args()
    os.makedirs(args.screenshots, exist_ok=True)
    nodes = [
        # GPU 1: kernels all the time on 15 % of the SMs; GPU 7: 20 GiB held, nothing running.
        # The training GPUs' power moves every tick.
        (None, "node-page.png",
         {(1, None): ["busy_not_saturated"], (7, None): ["allocated_idle"]}, True),
        # MIG: GI 9 holds 2 GiB and is idle; the GPU itself is judged only through its instances.
        # Its loads are constant: the refresh shows the next tick's numbers, not new ones.
        ("h100-mig.toml", "node-page-mig.png", {(0, 9): ["allocated_idle"]}, False),
    ]
    # Side by side: each mostly waits for ticks and refreshes.
    with concurrent.futures.ThreadPoolExecutor(len(nodes)) as pool:
        checks = [pool.submit(check_node, args.exporter, scenario,
                              os.path.join(args.screenshots, png), marks, changing)
                  for scenario, png, marks, changing in nodes]
        for check in checks:
            check.result()


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"check-page: {e}", file=sys.stderr)
        sys.exit(1)
