"""The device check's one JSON and one Markdown file: every step's exit code (or why it was
skipped) and every run's summary, from what scripts/gpu_check.sh left under OUT.

    python scripts/gpu_check_summary.py OUT DEVICE

Exit 0 when every step that ran exited 0 and every run completed; 1 otherwise (the files
are written either way: a failed step is what the check is for).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from fsbench.errors import ConfigError
from fsbench.measurement.timeline import read_timelines
from fsbench.running.store import load_runs

# What a reader of the check needs from each run's summary, in this order.
RUN_KEYS = ("run_id", "trainer", "workload", "device", "status", "step_time_ms_median",
            "samples_per_s", "bubble_ratio", "exposed_comm_ratio", "comm_overlap_ratio",
            "sm_occupancy", "peak_memory_mb", "gpu_mem_used_peak_mib", "host_syncs_per_step",
            "host_syncs_fwd_bwd_per_step", "busy_source", "steps_profiled", "steps_timed",
            "flights", "flight_ms_median")


def read_steps(path: Path) -> list[dict]:
    steps = []
    for line in path.read_text().splitlines():
        name, _, result = line.partition("\t")
        if result.startswith("skipped"):
            steps.append({"step": name, "exit_code": None, "skipped": result.partition(": ")[2]})
        else:
            steps.append({"step": name, "exit_code": int(result), "skipped": None})
    return steps


def flights(run_dir: Path) -> dict:
    """How many collectives the run's timelines hold as flights, and their median time in
    flight: on NCCL a flight timed from its future would read about 0 ms (the check for
    the CUDA-event timing, fsbench.measurement.timeline.Flight)."""
    try:
        spans = read_timelines(run_dir)
    except (OSError, ConfigError):
        return {"flights": None, "flight_ms_median": None}
    f = spans[spans["kind"] == "flight"]
    return {"flights": int(len(f)), "flight_ms_median": float(f["dur_ns"].median() / 1e6) if len(f) else None}


def read_runs(store: Path, device: str) -> list[dict]:
    if not store.is_dir():
        return []
    runs = load_runs(store, status=None)  # a run that did not complete is a failure to show
    rows = []
    for _, r in runs.iterrows():
        row = {k: (None if k not in r or r[k] != r[k] else r[k]) for k in RUN_KEYS}  # NaN -> None
        row.update(flights(Path(r["run_dir"])))
        row["device"] = device
        rows.append({k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()})
    return rows


def markdown(doc: dict) -> str:
    lines = [f"# Device check ({doc['device']})", "",
             f"All steps that ran passed: {'yes' if doc['ok'] else 'NO'}.", "",
             "| step | result |", "|---|---|"]
    for s in doc["steps"]:
        result = f"skipped: {s['skipped']}" if s["skipped"] else f"exit {s['exit_code']}"
        lines.append(f"| {s['step']} | {result} |")
    if doc["runs"]:
        keys = [k for k in RUN_KEYS if k not in ("run_id", "device")]
        lines += ["", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        for r in doc["runs"]:
            lines.append("| " + " | ".join("n/a" if r[k] is None else
                                           (f"{r[k]:.4g}" if isinstance(r[k], float) else str(r[k]))
                                           for k in keys) + " |")
    return "\n".join(lines) + "\n"


def main(out: str, device: str) -> int:
    out_dir = Path(out)
    steps = read_steps(out_dir / "steps.tsv")
    runs = read_runs(out_dir / "runs", device)
    ok = (all(s["exit_code"] == 0 for s in steps if s["skipped"] is None)
          and all(r["status"] == "complete" for r in runs))
    doc = {"device": device, "ok": ok, "steps": steps, "runs": runs}
    (out_dir / "summary.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out_dir / "summary.md").write_text(markdown(doc))
    print(f"wrote {out_dir / 'summary.json'} and {out_dir / 'summary.md'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
