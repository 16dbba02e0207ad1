#!/usr/bin/env python3
"""`nvidia-smi -L` where NVIDIA's driver utilities are not installed: lists the GPUs of the NVML
library first on LD_LIBRARY_PATH (in the benchmark, nvml-sim) in nvidia-smi's format,
`GPU 0: NAME (UUID: GPU-...)`. all-smi, a peer in bench/bench.py, looks for NVIDIA GPUs with
`lspci` or `nvidia-smi -L` before it opens NVML; the harness runs this once per scenario and
puts a shell script printing its answer first on all-smi's PATH (bench.py: nvidia_smi_stand_in)."""

import sys

import pynvml

if sys.argv[1:] != ["-L"]:
    print(f"nvidia-smi stand-in ({__file__}) answers only -L, not {sys.argv[1:]}", file=sys.stderr)
    sys.exit(2)
pynvml.nvmlInit()
for i in range(pynvml.nvmlDeviceGetCount()):
    handle = pynvml.nvmlDeviceGetHandleByIndex(i)
    print(f"GPU {i}: {pynvml.nvmlDeviceGetName(handle)} (UUID: {pynvml.nvmlDeviceGetUUID(handle)})")
pynvml.nvmlShutdown()
