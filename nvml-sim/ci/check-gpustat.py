#!/usr/bin/env python3
"""Fidelity check: real NVML clients (gpustat and pynvml) against libnvml_sim.so.

For every scenario in nvml-sim/scenarios/, this makes a temporary directory holding a
`libnvidia-ml.so.1` symlink to the simulator, runs `gpustat --json` and a pynvml snippet with
LD_LIBRARY_PATH and NVML_SIM_SCENARIO pointing there, and checks that every scenario GPU is listed
with the scenario's name, UUID, total memory and processes.

gpustat resolves each process through psutil and silently drops PIDs that do not exist on this
host, which the scenarios' PIDs do not; so gpustat's process lists are only checked to be a subset
of the scenario's, and the full lists are checked through pynvml
(nvmlDeviceGetComputeRunningProcesses / nvmlDeviceGetGraphicsRunningProcesses).

The clock is pinned (NVML_SIM_TIME) to the first whole second >= 60 at which no injected fault
is active, so fault scenarios are checked in a healthy moment.

Usage: check-gpustat.py PATH/TO/libnvml_sim.so     (needs: pip install gpustat nvidia-ml-py)
Exit status: 0 when everything matches, 1 on any mismatch (each one printed), 2 on usage errors.
"""

import json
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCENARIOS = HERE.parent / "scenarios"
PRESETS = HERE.parent / "src" / "models.toml"
MIB = 1024 * 1024

PYNVML_SNIPPET = r"""
import json, pynvml as N
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
        gpus.append({
            "index": i,
            "name": g["name"],
            "uuid": g["uuid"],
            "memory_total": g["memory_total_mib"] * MIB,
            "processes": procs,
        })
    return gpus


def run(cmd, env):
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stderr.strip()}")
    return json.loads(r.stdout)


def check_scenario(path, lib, presets):
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
        for key in ("index", "name", "uuid", "memory_total", "processes"):
            if g[key] != w[key]:
                errors.append(f"pynvml GPU {w['index']}: {key} is {g[key]!r}, scenario says {w[key]!r}")
    if errors:
        return [f"{path.name} (t={t}): {e}" for e in errors]
    print(f"ok   {path.name}: {len(want)} GPUs, "
          f"{sum(len(w['processes']) for w in want)} processes (t={t}, driver {pynvml['driver']})")
    return []


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    lib = Path(sys.argv[1]).resolve()
    if not lib.is_file():
        print(f"check-gpustat: no such library: {lib}", file=sys.stderr)
        return 2
    presets = tomllib.loads(PRESETS.read_text())
    scenarios = sorted(SCENARIOS.glob("*.toml"))
    errors = []
    for path in scenarios:
        errors += check_scenario(path, lib, presets)
    for e in errors:
        print(f"FAIL {e}", file=sys.stderr)
    if errors:
        print(f"check-gpustat: {len(errors)} mismatch(es)", file=sys.stderr)
        return 1
    print(f"check-gpustat: all {len(scenarios)} scenarios match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
