"""The device check's first step: what this machine has, in a few seconds.

    python scripts/gpu_preflight.py OUT_JSON [--dry-run]

Imports every module the check needs and names each one that is missing, with its error;
reports the Python, torch, CUDA and NCCL versions, the GPU (name, compute capability,
memory), NVML and whether it gives GPM SM occupancy, and whether symmetric memory
imports. Writes OUT_JSON and prints one line per fact. Exit 1 when a needed module is
missing or, without --dry-run, when there is no CUDA device or no NCCL: every later
step would fail for the same reason, so the check stops there and says so.
"""
from __future__ import annotations

import importlib
import json
import platform
import sys
import time
import traceback
from pathlib import Path

# What the check imports (the runs, the self-tests, the summary), and what only adds.
NEEDED = ("numpy", "pandas", "pyarrow", "psutil", "tabulate", "scipy", "yaml", "numba",
          "pynvml", "torch", "torch.distributed", "fsbench.cli", "fsbench.measurement.selftests",
          "fsbench.running.groundtruth", "fsbench.scaling.micro", "freescale_impl.trainer",
          "freescale_impl.transport_selftest", "baselines.ddp")
OPTIONAL = ("pytest", "hypothesis", "matplotlib", "torchrec", "deepspeed")


def try_import(name: str) -> dict:
    t0 = time.monotonic()
    try:
        module = importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - an import can fail with anything
        return {"module": name, "ok": False, "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc(limit=3)}
    return {"module": name, "ok": True, "version": getattr(module, "__version__", None),
            "seconds": round(time.monotonic() - t0, 2)}


def gpu_facts() -> dict:
    import torch
    import torch.distributed as dist

    facts = {"torch": torch.__version__, "cuda_build": torch.version.cuda,
             "cuda_available": torch.cuda.is_available(), "gpus": torch.cuda.device_count(),
             "nccl_available": dist.is_nccl_available()}
    try:
        from torch.distributed import _symmetric_memory  # noqa: F401
        facts["symmetric_memory"] = True
    except ImportError as e:
        facts["symmetric_memory"] = f"not importable: {e}"
    if not facts["cuda_available"]:
        return facts
    props = torch.cuda.get_device_properties(0)
    facts.update(gpu=props.name, capability=f"{props.major}.{props.minor}",
                 memory_gib=round(props.total_memory / 2**30, 1),
                 nccl=".".join(map(str, torch.cuda.nccl.version())))
    from fsbench.measurement.nvml import NvmlSampler

    sampler = NvmlSampler(0)
    facts["nvml"] = sampler.ok
    facts["gpm_sm_occupancy"] = sampler.gpm_reason or True
    sampler.close()
    return facts


def main(out_json: str, dry_run: bool) -> int:
    doc = {"python": platform.python_version(), "dry_run": dry_run,
           "needed": [try_import(m) for m in NEEDED], "optional": [try_import(m) for m in OPTIONAL]}
    missing = [m["module"] for m in doc["needed"] if not m["ok"]]
    doc["missing"] = missing
    problems = [f"missing module {m['module']}: {m['error']}" for m in doc["needed"] if not m["ok"]]
    if "torch" not in missing:
        doc["gpu"] = gpu_facts()
        if not dry_run and not doc["gpu"]["cuda_available"]:
            problems.append("no CUDA device (torch.cuda.is_available() is False)")
        if not dry_run and not doc["gpu"]["nccl_available"]:
            problems.append("torch has no NCCL")
    doc["problems"] = problems
    Path(out_json).parent.mkdir(parents=True, exist_ok=True)
    Path(out_json).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"python {doc['python']}")
    for m in doc["needed"] + doc["optional"]:
        print(f"{m['module']}: " + (f"ok {m.get('version') or ''}" if m["ok"] else f"MISSING ({m['error']})"))
    for key, value in doc.get("gpu", {}).items():
        print(f"{key}: {value}")
    for p in problems:
        print(f"PROBLEM: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], "--dry-run" in sys.argv[2:]))
