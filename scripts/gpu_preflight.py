"""The device check's first step: what this machine has and allows, in a few seconds.

    python scripts/gpu_preflight.py OUT_JSON [--dry-run]

Imports every module the check needs and names each one that is missing, with its error;
reports the Python, torch, CUDA and NCCL versions, the driver and the kernel release, the
GPU (name, compute capability, memory) and whether symmetric memory imports. Then it
tries what every later step needs, so that a broken piece shows here and not as every
later step failing (about 2 s):
- `gpm`: two NVML GPM samples 150 ms apart (fsbench.measurement.nvml.gpm_probe): SM
  occupancy, or NVML's error and whether it is the environment's (counters the host
  hides: the occupancy self-test and each run's occupancy check are then "not run:
  environment", not failures);
- `collective`: a world of one on NCCL (gloo in the dry run) and one all-reduce;
- `kernel`: one kernel launched and its result read back.
Writes OUT_JSON and prints one line per fact. Exit 1 when a needed module is missing or,
without --dry-run, when there is no CUDA device or NCCL, or the all-reduce or the kernel
failed: every later step would fail for the same reason, so the check stops there and
says so. A GPU without GPM is no reason to stop.
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
          "fsbench.measurement.copy_engines", "fsbench.running.groundtruth", "fsbench.scaling.micro",
          "freescale_impl.trainer", "freescale_impl.transport_selftest", "baselines.ddp")
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


def attempt(what) -> dict:
    """Run `what()` (-> dict of facts) timed; its error, named, where it raises."""
    t0 = time.monotonic()
    try:
        out = {"ok": True, **what()}
    except Exception as e:  # noqa: BLE001 - what failed is the finding
        out = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=4)}
    out["seconds"] = round(time.monotonic() - t0, 2)
    return out


def one_rank_all_reduce(device) -> dict:
    """A world of one on the runs' backend and one all-reduce: NCCL's communicator and
    kernel path on CUDA (at one rank it launches no reduction, but it inits and enqueues)."""
    import torch
    import torch.distributed as dist

    from fsbench.training.dist import one_rank_backend, one_rank_group

    with one_rank_group(device) as group:
        x = torch.full((1024,), 2.0, device=device)
        dist.all_reduce(x, group=group)
        value = float(x.sum())  # note: a sync point: the collective has finished
    if value != 2048.0:
        raise RuntimeError(f"all-reduce of 1024 twos at one rank gave {value}, not 2048")
    return {"backend": one_rank_backend(device), "value": value}


def one_kernel(device) -> dict:
    import torch

    value = float(torch.arange(1 << 20, device=device, dtype=torch.float64).sum())  # note: a sync point
    if value != (1 << 20) * ((1 << 20) - 1) / 2:
        raise RuntimeError(f"sum of 0..2^20-1 gave {value}")
    return {"value": value}


def gpu_facts() -> dict:
    import torch
    import torch.distributed as dist

    facts = {"torch": torch.__version__, "cuda_build": torch.version.cuda,
             "cuda_available": torch.cuda.is_available(), "gpus": torch.cuda.device_count(),
             "nccl_available": dist.is_nccl_available(), "kernel_release": platform.release()}
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
    facts["driver"] = attempt(driver_version)
    return facts


def driver_version() -> dict:
    import pynvml

    pynvml.nvmlInit()
    try:
        return {"version": pynvml.nvmlSystemGetDriverVersion()}
    finally:
        pynvml.nvmlShutdown()


def main(out_json: str, dry_run: bool) -> int:
    doc = {"python": platform.python_version(), "dry_run": dry_run,
           "needed": [try_import(m) for m in NEEDED], "optional": [try_import(m) for m in OPTIONAL]}
    missing = [m["module"] for m in doc["needed"] if not m["ok"]]
    doc["missing"] = missing
    problems = [f"missing module {m['module']}: {m['error']}" for m in doc["needed"] if not m["ok"]]
    if "torch" not in missing:
        doc["gpu"] = gpu = gpu_facts()
        if not dry_run and not gpu["cuda_available"]:
            problems.append("no CUDA device (torch.cuda.is_available() is False)")
        if not dry_run and not gpu["nccl_available"]:
            problems.append("torch has no NCCL")
        if "fsbench.cli" not in missing and (gpu["cuda_available"] or dry_run):
            # The dry run tries the same on CPU (gloo, a CPU op): the code path, not the GPU.
            from fsbench.measurement.nvml import gpm_probe

            device = "cuda:0" if gpu["cuda_available"] else "cpu"
            gpu["gpm"] = attempt(lambda: gpm_probe(0))  # recorded; no GPM is no reason to stop
            for key, probe in (("collective", one_rank_all_reduce), ("kernel", one_kernel)):
                gpu[key] = attempt(lambda probe=probe: probe(device))
                if not gpu[key]["ok"]:
                    problems.append(f"the one-rank {key} check failed on {device}: {gpu[key]['error']}")
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
