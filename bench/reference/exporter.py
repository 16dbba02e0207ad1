#!/usr/bin/env python3
"""The GPU exporter many teams write themselves: prometheus_client + nvidia-ml-py (pynvml).

It is the reference peer of the benchmark (BENCHMARKS.md): a custom collector that reads every
GPU through NVML on each scrape and exports the same core metrics, with the same names and base
units, as nvml-exporter. Written the way such scripts usually are (one process, reads per scrape,
NOT_SUPPORTED skipped), not tuned, so the comparison is against what is actually deployed.

    LD_LIBRARY_PATH=<dir with libnvidia-ml.so.1> python3 exporter.py --port 9500
"""

import argparse
import signal
import sys
import threading

import pynvml as N
from prometheus_client import REGISTRY, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CLOCKS = {"graphics": N.NVML_CLOCK_GRAPHICS, "sm": N.NVML_CLOCK_SM, "memory": N.NVML_CLOCK_MEM, "video": N.NVML_CLOCK_VIDEO}
EVENT_REASONS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
}


def read(fn, *args):
    """One NVML reading, or None when the device does not support it (or it failed)."""
    try:
        return fn(*args)
    except N.NVMLError:
        return None


class GpuCollector:
    """Reads all GPUs on every collect() call, as a scrape-driven exporter does."""

    def collect(self):
        ids = ["gpu", "uuid"]
        fam = {
            "info": GaugeMetricFamily("nvidia_gpu_info", "Static identity.", labels=ids + ["name", "pci_bus_id", "driver_version"]),
            "up": GaugeMetricFamily("nvidia_gpu_up", "1 when the GPU answered.", labels=ids),
            "util": GaugeMetricFamily("nvidia_gpu_utilization_ratio", "GPU utilization.", labels=ids),
            "memutil": GaugeMetricFamily("nvidia_gpu_memory_utilization_ratio", "Memory utilization.", labels=ids),
            "memtotal": GaugeMetricFamily("nvidia_gpu_memory_total_bytes", "Total memory.", labels=ids),
            "memused": GaugeMetricFamily("nvidia_gpu_memory_used_bytes", "Used memory.", labels=ids),
            "memfree": GaugeMetricFamily("nvidia_gpu_memory_free_bytes", "Free memory.", labels=ids),
            "power": GaugeMetricFamily("nvidia_gpu_power_watts", "Power draw.", labels=ids),
            "plimit": GaugeMetricFamily("nvidia_gpu_power_limit_watts", "Enforced power limit.", labels=ids),
            "energy": CounterMetricFamily("nvidia_gpu_energy_joules", "Energy consumed.", labels=ids),
            "temp": GaugeMetricFamily("nvidia_gpu_temperature_celsius", "GPU temperature.", labels=ids),
            "clock": GaugeMetricFamily("nvidia_gpu_clock_hertz", "Clock frequency.", labels=ids + ["clock"]),
            "pstate": GaugeMetricFamily("nvidia_gpu_performance_state", "P-state.", labels=ids),
            "fan": GaugeMetricFamily("nvidia_gpu_fan_speed_ratio", "Fan speed.", labels=ids + ["fan"]),
            "event": GaugeMetricFamily("nvidia_gpu_clock_event_active", "Clock event reasons.", labels=ids + ["reason"]),
            "pcietx": GaugeMetricFamily("nvidia_gpu_pcie_transmit_bytes_per_second", "PCIe TX.", labels=ids),
            "pcierx": GaugeMetricFamily("nvidia_gpu_pcie_receive_bytes_per_second", "PCIe RX.", labels=ids),
            "ecc": CounterMetricFamily("nvidia_gpu_ecc_errors", "Volatile ECC errors.", labels=ids + ["error_type"]),
        }
        driver = read(N.nvmlSystemGetDriverVersion) or ""
        for i in range(N.nvmlDeviceGetCount()):
            h = read(N.nvmlDeviceGetHandleByIndex, i)
            uuid = read(N.nvmlDeviceGetUUID, h) if h else None
            lv = [str(i), uuid or ""]
            if h is None or uuid is None:
                fam["up"].add_metric(lv, 0)
                continue
            fam["up"].add_metric(lv, 1)
            pci = read(N.nvmlDeviceGetPciInfo, h)
            fam["info"].add_metric(lv + [read(N.nvmlDeviceGetName, h) or "", pci.busId if pci else "", driver], 1)
            u = read(N.nvmlDeviceGetUtilizationRates, h)
            if u:
                fam["util"].add_metric(lv, u.gpu / 100)
                fam["memutil"].add_metric(lv, u.memory / 100)
            m = read(N.nvmlDeviceGetMemoryInfo, h)
            if m:
                fam["memtotal"].add_metric(lv, m.total)
                fam["memused"].add_metric(lv, m.used)
                fam["memfree"].add_metric(lv, m.free)
            for key, fn, scale in (
                ("power", N.nvmlDeviceGetPowerUsage, 1e-3),
                ("plimit", N.nvmlDeviceGetEnforcedPowerLimit, 1e-3),
                ("energy", N.nvmlDeviceGetTotalEnergyConsumption, 1e-3),
                ("pstate", N.nvmlDeviceGetPerformanceState, 1),
            ):
                v = read(fn, h)
                if v is not None:
                    fam[key].add_metric(lv, v * scale)
            t = read(N.nvmlDeviceGetTemperature, h, N.NVML_TEMPERATURE_GPU)
            if t is not None:
                fam["temp"].add_metric(lv, t)
            for name, clock in CLOCKS.items():
                c = read(N.nvmlDeviceGetClockInfo, h, clock)
                if c is not None:
                    fam["clock"].add_metric(lv + [name], c * 1e6)
            for fan in range(read(N.nvmlDeviceGetNumFans, h) or 0):
                s = read(N.nvmlDeviceGetFanSpeed_v2, h, fan)
                if s is not None:
                    fam["fan"].add_metric(lv + [str(fan)], s / 100)
            mask = read(N.nvmlDeviceGetCurrentClocksEventReasons, h)
            if mask is not None:
                for name, bit in EVENT_REASONS.items():
                    fam["event"].add_metric(lv + [name], 1 if mask & bit else 0)
            for key, counter in (("pcietx", N.NVML_PCIE_UTIL_TX_BYTES), ("pcierx", N.NVML_PCIE_UTIL_RX_BYTES)):
                v = read(N.nvmlDeviceGetPcieThroughput, h, counter)
                if v is not None:
                    fam[key].add_metric(lv, v * 1024)
            for name, kind in (("corrected", N.NVML_MEMORY_ERROR_TYPE_CORRECTED), ("uncorrected", N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
                v = read(N.nvmlDeviceGetTotalEccErrors, h, kind, N.NVML_VOLATILE_ECC)
                if v is not None:
                    fam["ecc"].add_metric(lv + [name], v)
        yield from fam.values()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9500)
    parser.add_argument("--addr", default="127.0.0.1")
    args = parser.parse_args()
    N.nvmlInit()
    REGISTRY.register(GpuCollector())
    start_http_server(args.port, addr=args.addr)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    N.nvmlShutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
