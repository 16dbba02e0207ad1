#!/usr/bin/env python3
"""Fidelity check: real NVML clients (gpustat, pynvml and nvitop) against libnvml_sim.so.

For every scenario in nvml-sim/scenarios/, this makes a temporary directory holding a
`libnvidia-ml.so.1` symlink to the simulator, runs `gpustat --json` and a pynvml snippet with
LD_LIBRARY_PATH and NVML_SIM_SCENARIO pointing there, and checks that every scenario GPU is listed
with the scenario's name, UUID, total memory and processes, and through pynvml its NVLink fabric
(the versioned fabric call, the struct as NVIDIA's binding lays it out). `nvitop --once` must print no error
line or traceback (nvitop catches a failed NVML call, prints it and goes on, exiting 0), list every
scenario GPU by PCI bus id, and under each GPU in MIG mode one row per MIG device alive then.
nvitop's TUI then runs in a detached tmux session until it has redrawn twice: it must show every
GPU, print nothing to stderr and quit cleanly on `q`. nvitop-exporter serves /metrics with every
scenario GPU (by UUID, with its total memory) and every live MIG device, and logs no error.
Given the exporter's binary too, nvml-exporter runs on the same scenario and pinned instant, and
its memory, power, temperature and utilization of every GPU must equal nvitop-exporter's.

gpustat resolves each process through psutil and silently drops PIDs that do not exist on this
host, which the scenarios' PIDs do not; so gpustat's process lists are only checked to be a subset
of the scenario's, and the full lists are checked through pynvml
(nvmlDeviceGetComputeRunningProcesses / nvmlDeviceGetGraphicsRunningProcesses).

The clock is pinned (NVML_SIM_TIME) to the first whole second >= 60 at which no injected fault
is active, so fault scenarios are checked in a healthy moment.

Usage: check-gpustat.py PATH/TO/libnvml_sim.so [PATH/TO/nvml-exporter]
(needs: pip install gpustat nvidia-ml-py nvitop nvitop-exporter; tmux)
Exit status: 0 when everything matches, 1 on any mismatch (each one printed), 2 on usage errors.
"""

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCENARIOS = HERE.parent / "scenarios"
PRESETS = HERE.parent / "src" / "models.toml"
MIB = 1024 * 1024

PYNVML_SNIPPET = r"""
import ctypes, json, pynvml as N

def fabric(h):
    # The versioned call with the v2 struct, as NVIDIA's own binding lays it out; None where the
    # GPU is on no fabric or the library has no such call.
    info = N.c_nvmlGpuFabricInfo_v2_t()
    try:
        N.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(info))
    except (N.NVMLError_NotSupported, N.NVMLError_FunctionNotFound):
        return None
    return {"state": info.state, "status": info.status, "clique_id": info.cliqueId,
            "cluster_uuid": bytes(info.clusterUuid).hex(), "health_mask": info.healthMask}

N.nvmlInit()
out = {"driver": N.nvmlSystemGetDriverVersion(), "gpus": []}
for i in range(N.nvmlDeviceGetCount()):
    h = N.nvmlDeviceGetHandleByIndex(i)
    procs = {}
    for kind, fn in (("compute", N.nvmlDeviceGetComputeRunningProcesses),
                     ("graphics", N.nvmlDeviceGetGraphicsRunningProcesses)):
        for p in fn(h):
            procs.setdefault(str(p.pid), {"used": p.usedGpuMemory, "kinds": []})["kinds"].append(kind)
    out["gpus"].append({
        "index": N.nvmlDeviceGetIndex(h),
        "name": N.nvmlDeviceGetName(h),
        "uuid": N.nvmlDeviceGetUUID(h),
        "memory_total": N.nvmlDeviceGetMemoryInfo(h).total,
        "processes": procs,
        "fabric": fabric(h),
    })
N.nvmlShutdown()
print(json.dumps(out))
"""


def merge(base, over):
    """Merge `over` into a copy of `base`: tables key by key, anything else replaced."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def window_active(fault, t):
    start, end, period = fault.get("from", 0.0), fault["to"], fault.get("repeat")
    if period and t >= start:
        t = start + (t - start) % period
    return start <= t < end


def windows_ended(fault, t):
    start, end, period = fault.get("from", 0.0), fault["to"], fault.get("repeat")
    if t < end:
        return 0
    return int((t - end) // period) + 1 if period else 1


def gpus_dropped(fault, t):
    """A driver restart drops its `drop_gpus` after odd-numbered windows."""
    return (fault["kind"] == "driver_restart" and fault.get("drop_gpus")
            and windows_ended(fault, t) % 2 == 1)


def quiet_time(scenario):
    """First whole second >= 60 with no fault window active (init faults included) and every
    GPU present (no driver restart has dropped one)."""
    faults = scenario.get("fault", [])
    for t in range(60, 3600):
        if not any(window_active(f, t) or gpus_dropped(f, t) for f in faults):
            return t
    raise SystemExit("no fault-free moment in the first hour")


def alive(process, t):
    return process.get("from", float("-inf")) <= t < process.get("to", float("inf"))


def expected_gpus(scenario, presets, t):
    gpus = []
    for i, table in enumerate(scenario["gpu"]):
        g = merge(presets[table["model"]], table)
        procs = {}
        for p in g.get("process", []):
            if alive(p, t):
                kind = p.get("kind", "compute")
                kinds = ["compute", "graphics"] if kind == "both" else [kind]
                procs[str(p["pid"])] = {"used": p["used_memory_mib"] * MIB, "kinds": kinds}
        f = g.get("fabric")
        gpus.append({
            "index": i,
            "name": g["name"],
            "uuid": g["uuid"],
            "memory_total": g["memory_total_mib"] * MIB,
            "processes": procs,
            "fabric": f and {
                "state": FABRIC_STATES[f["state"]],
                "status": f.get("status", 0),
                "clique_id": f.get("clique_id", 0),
                "cluster_uuid": f.get("cluster_uuid", "").replace("-", "") or "00" * 16,
                "health_mask": f.get("health_mask", 0),
            },
        })
    return gpus


# nvml.h's NVML_GPU_FABRIC_STATE_* for a scenario's fabric.state.
FABRIC_STATES = {"not_started": 1, "in_progress": 2, "completed": 3}


def run_text(cmd, env):
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stderr.strip()}")
    return r.stdout, r.stderr


def run(cmd, env):
    return json.loads(run_text(cmd, env)[0])


def bus_id(text):
    """A PCI bus id in NVML's long form ("00000000:1B:00.0"), from any spelling a scenario uses."""
    parts = text.split(":")
    domain = int(parts[0], 16) if len(parts) == 3 else 0
    dev, fn = parts[-1].split(".")
    return f"{domain:08X}:{int(parts[-2], 16):02X}:{int(dev, 16):02X}.{int(fn, 16):X}"


def mig_devices(gpu, t):
    """MIG devices (compute instances) alive at t, or None when the GPU is not in MIG mode."""
    mig = gpu.get("mig", {})
    if not mig.get("enabled"):
        return None
    return sum(len(gi.get("compute", [{}])) for gi in mig.get("instance", []) if alive(gi, t))


# What nvitop prints when an NVML call or its own code fails (it goes on and exits 0).
NVITOP_FAILURE = re.compile(r"Traceback|Error|ERROR|FunctionNotFound|Exception")
# A GPU row of nvitop's device table: "│   0  H100 80GB HBM3   On │ 00000000:18:00.0 Off │".
NVITOP_GPU = re.compile(r"^│\s+(\d+)\s.*│ ([0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-9A-F]) ")
# A MIG device row: "│ 0:1      2g.20gb @ GI/CI: 3/0 │".
NVITOP_MIG = re.compile(r"^│ (\d+):(\d+)\s+\S+ @ GI/CI:")


def check_nvitop(out, err, scenario, t):
    """Errors in `nvitop --once` output: failure lines, GPUs missing by bus id, MIG rows."""
    errors = [f"nvitop printed: {line.strip()}"
              for line in (out + err).splitlines() if NVITOP_FAILURE.search(line)]
    gpus = scenario["gpu"]
    rows = [m.groups() for m in map(NVITOP_GPU.match, out.splitlines()) if m]
    want = [bus_id(g["pci_bus_id"]) for g in gpus]
    if [bus for _, bus in rows] != want:
        errors.append(f"nvitop lists GPUs {rows}, scenario has bus ids {want}")
    migs = [m.groups() for m in map(NVITOP_MIG.match, out.splitlines()) if m]
    for i, g in enumerate(gpus):
        count = mig_devices(g, t)
        got = sum(1 for gpu, _ in migs if int(gpu) == i)
        if (count or 0) != got:
            errors.append(f"nvitop shows {got} MIG devices under GPU {i}, scenario has {count or 0}")
    return errors


def poll(what, f, seconds=20):
    """Calls f until it returns something true, for at most `seconds`; raises naming `what`."""
    deadline = time.monotonic() + seconds
    while True:
        value = f()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)


# A GPU's first row in nvitop's TUI, in its full and its compact (many GPUs) layout:
# "│   0  H100 80GB HBM3   On │ 00000000:18:00.0 …" or "│   0 N/A  34C  P0   72W / 700W │ …".
NVITOP_TUI_GPU = re.compile(r"^│\s+(\d+)\s+\S")


def tui_gpus(screen):
    """Indices of the GPUs nvitop's device panel shows (the lines above the process panel)."""
    panel = screen.split("Processes:")[0]
    return {int(m.group(1)) for m in map(NVITOP_TUI_GPU.match, panel.splitlines()) if m}


def check_nvitop_tui(env, count):
    """Errors of nvitop's TUI in a detached tmux session: it must draw `count` GPUs, redraw (its
    header clock changes twice), print nothing to stderr and exit 0 on `q`."""
    tmux = ["tmux", "-L", f"nvml-sim-check-{os.getpid()}"]
    with tempfile.TemporaryDirectory() as tmp:
        err, rc = Path(tmp) / "stderr", Path(tmp) / "rc"
        cmd = f"{shlex.quote(sys.executable)} -m nvitop 2>{err}; echo $? >{rc}"
        env = {"TERM": "xterm-256color", **env}
        subprocess.run([*tmux, "new-session", "-d", "-x", "200", "-y", "60", cmd],
                       env=env, check=True, timeout=30)
        try:
            def pane():
                return subprocess.run([*tmux, "capture-pane", "-p"], env=env, capture_output=True,
                                      text=True, timeout=30).stdout
            headers = set()

            def redrawn():
                text = pane()
                if tui_gpus(text) == set(range(count)):
                    headers.add(text.splitlines()[0] if text else "")
                return len(headers) >= 3
            try:
                poll("nvitop's TUI to show every GPU and redraw", redrawn)
            except RuntimeError as e:
                return [f"nvitop TUI: {e}; screen:\n{pane()}"]
            subprocess.run([*tmux, "send-keys", "q"], env=env, check=True, timeout=30)
            poll("nvitop's TUI to quit", rc.exists)
            # The shell writes the status after the redirect opens the file: wait for its line.
            status = poll("nvitop's exit status", lambda: rc.read_text().strip())
        finally:
            subprocess.run([*tmux, "kill-server"], env=env, capture_output=True, timeout=30)
        printed = err.read_text().strip()
        errors = [f"nvitop TUI printed to stderr:\n{printed}"] if printed else []
        if status != "0":
            errors.append(f"nvitop TUI exited {status}")
        return errors


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A sample of the Prometheus text format: name, labels, value.
SAMPLE = re.compile(r'^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def samples(text):
    """(name, labels, value) of every sample in an exposition."""
    out = []
    for m in map(SAMPLE.match, text.splitlines()):
        if m:
            out.append((m.group(1), dict(LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return out


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return samples(r.read().decode())


def check_nvitop_exporter(env, want, scenario, t):
    """Errors of nvitop-exporter and its last scrape: its /metrics must list every GPU (UUID,
    total memory) and every live MIG device, and its log must hold no error line."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "nvitop_exporter", "--bind-address",
                             "127.0.0.1", "--port", str(port), "--interval", "0.5"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    expected = {str(w["index"]): (w["uuid"], w["memory_total"] // MIB) for w in want}
    migs = sum(mig_devices(g, t) or 0 for g in scenario["gpu"])
    rows, last = {}, []

    def scraped():
        try:
            last[:] = scrape(port)
        except OSError:
            return proc.poll() is not None  # stop polling once it died
        rows.clear()
        for name, labels, value in last:
            if name == "gpu_memory_total_MiB":
                rows[labels["index"]] = (labels["uuid"], value)
        return len(rows) >= len(expected) + migs
    try:
        try:
            poll("nvitop-exporter to serve every device", scraped, seconds=30)
            timed_out = ""
        except RuntimeError as e:
            timed_out = str(e)
    finally:
        proc.terminate()
        _, log = proc.communicate(timeout=30)
    errors = [f"nvitop-exporter logged: {line}" for line in log.splitlines()
              if NVITOP_FAILURE.search(line)]
    if timed_out or proc.returncode not in (0, -15):
        errors.append(f"nvitop-exporter: {timed_out or f'exited {proc.returncode}'}")
    for index, (uuid, total) in expected.items():
        if index not in rows:
            errors.append(f"nvitop-exporter does not list GPU {index}")
        elif rows[index] != (uuid, float(total)):
            errors.append(f"nvitop-exporter GPU {index}: {rows[index]}, scenario says {(uuid, total)}")
    got_migs = sum(1 for index in rows if ":" in index)
    if got_migs != migs:
        errors.append(f"nvitop-exporter lists {got_migs} MIG devices, scenario has {migs}")
    return errors, last


# nvml-exporter's family, nvitop-exporter's, and the factor from theirs to ours.
SAME_VALUES = [
    ("nvidia_gpu_memory_total_bytes", "gpu_memory_total_MiB", MIB),
    ("nvidia_gpu_memory_used_bytes", "gpu_memory_used_MiB", MIB),
    ("nvidia_gpu_power_watts", "gpu_power_usage_W", 1),
    ("nvidia_gpu_temperature_celsius", "gpu_temperature_C", 1),
    ("nvidia_gpu_utilization_ratio", "gpu_utilization_Percentage", 0.01),
]


def check_against_exporter(exporter, lib, env, want, theirs):
    """Errors where nvml-exporter, on the same scenario and pinned instant, serves another value
    than nvitop-exporter for a GPU (N/A on both sides agrees: absent for us, NaN for nvitop)."""
    port = free_port()
    proc = subprocess.Popen([str(exporter), "--nvml-lib", str(lib), "--listen",
                             f"127.0.0.1:{port}"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    ours = []

    def scraped():
        try:
            ours[:] = scrape(port)
        except OSError:
            return proc.poll() is not None
        return sum(n == "nvidia_gpu_memory_total_bytes" for n, _, _ in ours) >= len(want)
    try:
        try:
            poll("nvml-exporter to serve every GPU", scraped, seconds=30)
        except RuntimeError as e:
            return [f"nvml-exporter: {e}"]
    finally:
        proc.terminate()
        _, log = proc.communicate(timeout=30)
    if proc.returncode not in (0, -15):
        return [f"nvml-exporter exited {proc.returncode}:\n{log.strip()}"]
    # The GPU's own series (a GPU in MIG mode also has one per GPU instance, gpu_instance="N").
    mine = {(n, lb.get("uuid")): v for n, lb, v in ours if not lb.get("gpu_instance")}
    other = {(n, lb.get("uuid")): v for n, lb, v in theirs}
    errors, compared = [], 0
    for w in want:
        for our_name, their_name, factor in SAME_VALUES:
            a = mine.get((our_name, w["uuid"]))
            b = other.get((their_name, w["uuid"]), float("nan")) * factor
            if a is None and b != b:
                continue
            compared += 1
            if a is None or b != b or abs(a - b) > 1e-6 * max(1.0, abs(a)):
                errors.append(f"GPU {w['index']}: {our_name} is {a}, nvitop-exporter's "
                              f"{their_name} says {b}")
    if compared < len(want):
        errors.append(f"only {compared} values compared with nvitop-exporter")
    # Each MIG device nvitop-exporter lists, against its GPU instance's series of ours (found by
    # the MIG UUID; a MIG device's memory is its GPU instance's).
    gi_of = {lb["mig_uuid"]: (lb["uuid"], lb["gpu_instance"])
             for n, lb, _ in ours if n == "nvidia_gpu_mig_instance_info"}
    instance = {(n, lb.get("uuid"), lb["gpu_instance"]): v for n, lb, v in ours if lb.get("gpu_instance")}
    for mig_uuid in sorted({lb["uuid"] for _, lb, _ in theirs if lb.get("uuid", "").startswith("MIG-")}):
        if mig_uuid not in gi_of:
            errors.append(f"nvml-exporter serves no MIG device {mig_uuid}, nvitop-exporter does")
            continue
        for our_name, their_name, factor in SAME_VALUES[:2]:
            a = instance.get((our_name, *gi_of[mig_uuid]))
            b = other.get((their_name, mig_uuid), float("nan")) * factor
            if a is None or b != b or abs(a - b) > 1e-6 * max(1.0, abs(a)):
                errors.append(f"MIG device {mig_uuid}: {our_name} is {a}, nvitop-exporter's "
                              f"{their_name} says {b}")
    return errors


def check_scenario(path, lib, presets, exporter):
    scenario = tomllib.loads(path.read_text())
    t = quiet_time(scenario)
    want = expected_gpus(scenario, presets, t)
    errors = []
    with tempfile.TemporaryDirectory() as tmp:
        os.symlink(lib, Path(tmp) / "libnvidia-ml.so.1")
        env = dict(os.environ)
        env.update({
            "LD_LIBRARY_PATH": tmp + os.pathsep + env.get("LD_LIBRARY_PATH", ""),
            "NVML_SIM_SCENARIO": str(path),
            "NVML_SIM_TIME": str(t),
        })
        env.pop("NVML_SIM_START", None)
        try:
            gpustat = run([sys.executable, "-m", "gpustat", "--json"], env)
            pynvml = run([sys.executable, "-c", PYNVML_SNIPPET], env)
            nvitop = run_text([sys.executable, "-m", "nvitop", "--once"], env)
            errors += check_nvitop_tui(env, len(scenario["gpu"]))
            exporter_errors, theirs = check_nvitop_exporter(env, want, scenario, t)
            errors += exporter_errors
            if exporter:
                errors += check_against_exporter(exporter, lib, env, want, theirs)
        except (RuntimeError, json.JSONDecodeError, subprocess.TimeoutExpired) as e:
            return [f"{path.name}: {e}"]

    got = gpustat["gpus"]
    if len(got) != len(want):
        errors.append(f"gpustat lists {len(got)} GPUs, scenario has {len(want)}")
    for w, g in zip(want, got):
        tag = f"gpustat GPU {w['index']}"
        for key, theirs in (("name", g["name"]), ("uuid", g["uuid"]),
                            ("memory_total", g["memory.total"] * MIB), ("index", g["index"])):
            if theirs != w[key]:
                errors.append(f"{tag}: {key} is {theirs!r}, scenario says {w[key]!r}")
        extra = {str(p["pid"]) for p in g.get("processes") or []} - set(w["processes"])
        if extra:
            errors.append(f"{tag}: processes {sorted(extra)} are not in the scenario")

    got = pynvml["gpus"]
    if len(got) != len(want):
        errors.append(f"pynvml lists {len(got)} GPUs, scenario has {len(want)}")
    for w, g in zip(want, got):
        for key in ("index", "name", "uuid", "memory_total", "processes", "fabric"):
            if g[key] != w[key]:
                errors.append(f"pynvml GPU {w['index']}: {key} is {g[key]!r}, scenario says {w[key]!r}")
    errors += check_nvitop(*nvitop, scenario, t)
    if errors:
        return [f"{path.name} (t={t}): {e}" for e in errors]
    clients = "gpustat, pynvml, nvitop, nvitop-exporter" + (" and nvml-exporter" if exporter else "")
    print(f"ok   {path.name}: {clients} agree on {len(want)} GPUs, "
          f"{sum(len(w['processes']) for w in want)} processes (t={t}, driver {pynvml['driver']})")
    return []


def main():
    if len(sys.argv) not in (2, 3):
        print(next(line for line in __doc__.splitlines() if line.startswith("Usage:")),
              file=sys.stderr)
        return 2
    lib = Path(sys.argv[1]).resolve()
    exporter = Path(sys.argv[2]).resolve() if len(sys.argv) == 3 else None
    for path in (lib, exporter):
        if path and not path.is_file():
            print(f"check-gpustat: no such file: {path}", file=sys.stderr)
            return 2
    presets = tomllib.loads(PRESETS.read_text())
    scenarios = sorted(SCENARIOS.glob("*.toml"))
    errors = []
    for path in scenarios:
        errors += check_scenario(path, lib, presets, exporter)
    for e in errors:
        print(f"FAIL {e}", file=sys.stderr)
    if errors:
        print(f"check-gpustat: {len(errors)} mismatch(es)", file=sys.stderr)
        return 1
    print(f"check-gpustat: all {len(scenarios)} scenarios match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
