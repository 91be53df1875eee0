"""The device check's self-tests: each CUDA measurement against a truth known on one GPU.

    python scripts/gpu_selftests.py OUT_JSON [WORK_DIR] [quick|ground-truth|all]

Runs fsbench.measurement.selftests (flight, compute span, host sync, Kineto busy, the
sleep kernel's warm calibration, SM occupancy), fsbench.measurement.copy_engines (what
moves a same-GPU and a pinned host-to-device copy), freescale_impl.transport_selftest
(the copy-engine transport's copies are communication, no host sync in an exchange, what
moves its one-rank pull) and the ground truth on CUDA (fsbench.running.groundtruth.cuda_selftest),
each guarded, and rewrites OUT_JSON after every one: a step killed at its budget still
leaves what finished. `quick` is every test but the ground truth (seconds), which the
check runs as a step of its own (a minute). Without CUDA (the dry run) every test is
listed as not run, after every module they need was imported. Exit 0 when every test
that ran passed.
"""
from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import torch

from fsbench.measurement import selftests
from fsbench.measurement.copy_engines import copies_on_copy_engines
from fsbench.measurement.device_sleep import sleep_kernel
from fsbench.running.groundtruth import cuda_selftest
from freescale_impl.transport_selftest import (sm_free_copies_are_communication, sm_free_exchange_never_syncs,
                                               sm_free_pull_sm_util)


def planned(device, work: Path) -> list[tuple[str, object]]:
    """(name, thunk) in the order they run: fastest and most telling first."""
    sleep = lambda: sleep_kernel(device)  # noqa: E731 - calibrated on first use
    return [
        ("flight_of_known_delay", lambda: selftests.flight_of_known_delay(device, work, sleep())),
        ("compute_span_of_known_kernels", lambda: selftests.compute_span_of_known_kernels(device, work, sleep())),
        ("planted_host_sync_counted_once", lambda: selftests.planted_host_sync_counted_once(device)),
        ("kineto_busy_of_known_sequence", lambda: selftests.kineto_busy_of_known_sequence(device, work, sleep())),
        ("sleep_lengths_match_nominal", lambda: selftests.sleep_lengths_match_nominal(device, sleep())),
        ("sm_occupancy_busy_and_idle", lambda: selftests.sm_occupancy_busy_and_idle(device)),
        ("copies_on_copy_engines", lambda: copies_on_copy_engines(device)),
        ("sm_free_copies_are_communication", lambda: sm_free_copies_are_communication(device, work)),
        ("sm_free_exchange_never_syncs", lambda: sm_free_exchange_never_syncs(device)),
        ("sm_free_pull_sm_util", lambda: sm_free_pull_sm_util(device)),
        ("ground_truth_on_cuda", lambda: cuda_selftest(work)),
    ]


GROUND_TRUTH = "ground_truth_on_cuda"


def main(out_json: str, work_dir: str | None = None, group: str = "all") -> int:
    if group not in ("quick", "ground-truth", "all"):
        raise SystemExit(f"group {group!r}: choose quick, ground-truth or all")
    out = Path(out_json)
    work = Path(work_dir) if work_dir else out.parent / "selftests"
    work.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0)
    doc = {"device": torch.cuda.get_device_name(0) if cuda else "no CUDA device", "tests": []}
    for name, thunk in planned(device, work):
        if (group == "quick" and name == GROUND_TRUTH) or (group == "ground-truth" and name != GROUND_TRUTH):
            continue
        t0 = time.monotonic()
        if not cuda:
            result = {"name": name, "passed": None, "detail": "not run: no CUDA device"}
        else:
            try:
                result = thunk().as_dict()
            except Exception as e:  # noqa: BLE001 - one broken test must not hide the others
                result = {"name": name, "passed": False, "detail": f"error: {type(e).__name__}: {e}",
                          "traceback": traceback.format_exc()}
        result["seconds"] = round(time.monotonic() - t0, 2)
        doc["tests"].append(result)
        out.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"{name}: {result['passed']} ({result.get('detail', '')})", flush=True)
    return 0 if all(t["passed"] is not False for t in doc["tests"]) else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
