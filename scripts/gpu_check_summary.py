"""The device check's report: $OUT/summary.json and $OUT/summary.md, from what
scripts/gpu_check.sh left (its steps.tsv under OUT, and the work folder outside it).

    python scripts/gpu_check_summary.py OUT DEVICE [--work DIR] [--steps-only] [--dry-run]

--steps-only is the cheap form the check writes after every step (standard library only,
no run is read): the steps so far, the preflight and the self-tests. The full form, at
exit, adds every run's summary and its checks (`judge_run`), the SM-contention
micro-benchmark, what moved each copy's bytes (`copy_verdicts`) and the calibration.
--work: the work folder (default OUT/work). Exit 0 when every step that ran exited 0,
every self-test that ran passed, every run completed and no run check failed; 3
otherwise, with the files written all the same (a failure is what the check is for).
Any other exit code means the report itself failed.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

# What a reader needs from each run's summary, in this order.
RUN_KEYS = ("run_id", "trainer", "options", "status", "step_time_ms_median", "samples_per_s",
            "bubble_ratio", "bubble_ratio_timed", "straggler_bubble_ratio", "exposed_comm_ratio",
            "input_stall_ratio", "other_idle_ratio", "memcpy_ratio", "profiler_overhead_ratio",
            "comm_overlap_ratio", "comm_overlap_source", "comm_overlap_note",
            "sm_occupancy", "sm_util", "sm_occupancy_reason", "host_syncs_per_step",
            "host_syncs_fwd_bwd_per_step", "peak_memory_mb", "gpu_proc_mem_peak_mib",
            "busy_source", "busy_source_note", "steps_profiled", "steps_timed", "flights",
            "flight_ms_median")
MD_RUN_KEYS = ("trainer", "options", "step_time_ms_median", "bubble_ratio", "bubble_ratio_timed",
               "straggler_bubble_ratio", "exposed_comm_ratio", "input_stall_ratio", "other_idle_ratio",
               "memcpy_ratio", "profiler_overhead_ratio", "sm_occupancy", "host_syncs_per_step",
               "host_syncs_fwd_bwd_per_step", "peak_memory_mb", "busy_source")
SELFTEST_FILES = ("selftests.json", "groundtruth.json")
# One GPU cannot show these; the report lists them as not checked, never as passed.
NOT_CHECKED = (
    "multi-rank NCCL: every run is world size 1, where an all-reduce launches no kernel and "
    "an all-to-all copies to itself (flights near 0 ms are then right, not a bug)",
    "copy-engine pulls between GPUs over NVLink (sm_free at one rank pulls from itself), and "
    "whether sm_free is SM-free at all between GPUs (one GPU can only judge its one-rank pull)",
    "straggler and imbalance attribution on GPU (one rank has no other rank to wait for: "
    "those ratios are 0 against 0, not checked)",
    "clocks across ranks (one rank, one clock: the offsets exchanged at the barrier are unused)",
    "the order of hook-issued collectives across ranks on NCCL (checked on CPU with 2 gloo "
    "ranks: tests/test_hook_order.py)",
    "FreeScale's balance switch (one rank has nothing to balance)",
    "FreeScale's exchange beyond one node: sm_free's split by node and the two-hop exchange "
    "(a2a=hierarchical), their groups across nodes and capped CTAs (one GPU has no second node)",
    "TorchRec and DeepSpeed (not installed on the GPU machine)",
)


def read_steps(path: Path) -> list[dict]:
    """steps.tsv: name, result (an exit code, `skipped: why` for a step this machine cannot
    run, `not run: why` for one that should have run: out of time, the preflight failed),
    seconds, budget."""
    steps = []
    if not path.exists():
        return steps
    for line in path.read_text().splitlines():
        name, result, seconds, budget = (line.split("\t") + ["", "", ""])[:4]
        row = {"step": name, "exit_code": None, "skipped": None, "not_run": None, "timed_out": False,
               "seconds": float(seconds) if seconds else None, "budget_s": int(budget) if budget else None}
        if result.startswith("skipped"):
            row["skipped"] = result.partition(": ")[2]
        elif result.startswith("not run"):
            row["not_run"] = result.partition(": ")[2]
        else:
            row["exit_code"] = int(result)
            row["timed_out"] = row["exit_code"] in (124, 137)
        steps.append(row)
    return steps


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_selftests(work: Path) -> list[dict]:
    tests = []
    for name in SELFTEST_FILES:
        doc = read_json(work / name)
        tests += doc.get("tests", []) if doc else []
    return tests


def _flights(run_dir: Path) -> dict:
    """How many collectives the run's timelines hold as flights, and their median time in
    flight (at one rank on NCCL, about 0 ms is the right answer)."""
    from fsbench.errors import ConfigError
    from fsbench.measurement.timeline import read_timelines

    try:
        spans = read_timelines(run_dir)
    except (OSError, ConfigError):
        return {"flights": None, "flight_ms_median": None}
    f = spans[spans["kind"] == "flight"]
    return {"flights": int(len(f)), "flight_ms_median": float(f["dur_ns"].median() / 1e6) if len(f) else None}


def changed_options(run_dir: Path, trainer: str) -> str:
    """The switches a run set away from its trainer's defaults ("defaults" when none)."""
    from fsbench.training.trainer import option_defaults, resolve_trainer_class

    given = (read_json(run_dir / "manifest.json") or {}).get("config", {}).get("trainer_options") or {}
    try:
        defaults = option_defaults(resolve_trainer_class(trainer))
    except Exception:  # noqa: BLE001 - a trainer this machine cannot import: show them all
        defaults = {}
    changed = {k: v for k, v in given.items() if str(defaults.get(k)) != str(v)}
    return ", ".join(f"{k}={v}" for k, v in sorted(changed.items())) or "defaults"


def read_runs(store: Path) -> list[dict]:
    if not store.is_dir():
        return []
    from fsbench.running.store import load_runs

    runs = load_runs(store, status=None)  # a run that did not complete is a failure to show
    rows = []
    for _, r in runs.iterrows():
        row = {k: (None if k not in r or r[k] is None or r[k] != r[k] else r[k]) for k in RUN_KEYS}
        row["options"] = changed_options(Path(r["run_dir"]), str(r["trainer"]))
        given = (read_json(Path(r["run_dir"]) / "manifest.json") or {}).get("config", {})
        row["transport"] = (given.get("trainer_options") or {}).get("transport", "collective")
        row.update(_flights(Path(r["run_dir"])))
        rows.append({k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()})
    return rows


def read_extras(work: Path) -> dict:
    """The SM-contention micro-benchmark's record and the calibration's fit, as written."""
    micro = [read_json(p) for p in sorted((work / "micro").glob("*.json"))] if (work / "micro").is_dir() else []
    fits = sorted(p for p in (work / "runs" / "calibrations").glob("*.json") if not p.name.startswith("comm__")) \
        if (work / "runs" / "calibrations").is_dir() else []
    return {"sm_contention": micro or None,
            "calibration": {"file": fits[0].name, "fit": read_json(fits[0])} if fits else None}


def _check(name: str, verdict: str, detail: str = "") -> dict:
    return {"check": name, "verdict": verdict, "detail": detail}


def judge_run(run: dict, preflight: dict | None, cuda: bool) -> list[dict]:
    """Each run's checks beyond completing, each a verdict: "passed", "FAILED" or "not run:
    why". On CUDA: its busy time is the kernel record's, at least one step was profiled,
    SM occupancy is there where preflight found GPM, and FreeScale over the collective
    transport has no host sync inside forward or backward. A dry run on CPU has none of
    these to show: not run, said so."""
    cpu = "not run: CPU run (dry run): no kernel record, no CUDA sync count"
    checks = [_check("completed", "passed" if run["status"] == "complete" else "FAILED", str(run["status"]))]
    if not cuda:
        checks += [_check(c, cpu) for c in ("busy from Kineto", "a profiled step", "SM occupancy")]
        if run["trainer"] == "freescale" and run.get("transport", "collective") == "collective":
            checks.append(_check("no host sync in fwd/bwd", cpu))
        return checks
    checks.append(_check("busy from Kineto", "passed" if run.get("busy_source") == "kineto" else "FAILED",
                         f"busy_source {run.get('busy_source')}: {run.get('busy_source_note') or ''}"))
    checks.append(_check("a profiled step", "passed" if (run.get("steps_profiled") or 0) >= 1 else "FAILED",
                         f"steps_profiled {run.get('steps_profiled')}"))
    gpm = ((preflight or {}).get("gpu") or {}).get("gpm") or {}
    if gpm.get("ok"):
        checks.append(_check("SM occupancy", "passed" if run.get("sm_occupancy") is not None else "FAILED",
                             str(run.get("sm_occupancy_reason") or run.get("sm_occupancy"))))
    else:
        why = gpm.get("error") or "preflight did not probe GPM"
        checks.append(_check("SM occupancy", f"not run: {'environment: ' if gpm.get('environment') else ''}{why}"))
    if run["trainer"] == "freescale" and run.get("transport", "collective") == "collective":
        syncs = run.get("host_syncs_fwd_bwd_per_step")
        checks.append(_check("no host sync in fwd/bwd", "passed" if syncs == 0 else "FAILED",
                             f"host_syncs_fwd_bwd_per_step {syncs}"))
    return checks


def copy_verdicts(selftests: list[dict], micro: list | None) -> dict:
    """What moved each copy's bytes, from the self-tests' records and the SM-contention
    record, and what follows for the sm_free transport (`finding`)."""
    copies = [{"source": t["name"], **c} for t in selftests for c in (t.get("record") or {}).get("copies", [])]
    for rec in micro or []:
        for kind, c in ((rec or {}).get("conditions") or {}).items():
            if "moved_by_claimed" in c:
                copies.append({"source": "sm-contention", "copy": kind, "sm_util": c.get("copy_sm_util_alone"),
                               "moved_by": c["moved_by"], "reason": c.get("copy_sm_util_reason")})
    pull = next((c for c in copies if c["copy"] == "sm_free_pull"), None)
    finding = ("the one-rank sm_free pull was not measured (no GPM reading, or the self-test did not run)"
               if pull is None or pull["sm_util"] is None else
               "the one-rank sm_free pull ran on SMs: the transport's SM-free claim can hold only "
               "between GPUs, which one GPU cannot check" if pull["moved_by"] == "SM" else
               "the one-rank sm_free pull ran on copy engines (between GPUs: not checked)")
    return {"copies": copies, "finding": finding}


def _cell(v) -> str:
    if v is None:
        return "n/a"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def preflight_lines(pre: dict | None) -> list[str]:
    """What the machine is and allows: versions, driver, kernel, GPM, NCCL, a kernel."""
    if not pre:
        return ["No preflight record."]
    gpu = pre.get("gpu") or {}
    lines = [f"- python {pre.get('python')}, torch {gpu.get('torch')}, CUDA {gpu.get('cuda_build')}, "
             f"NCCL {gpu.get('nccl', 'n/a')}, GPU {gpu.get('gpu', 'none')}, kernel release "
             f"{gpu.get('kernel_release')}, driver {(gpu.get('driver') or {}).get('version', 'n/a')}"]
    for key in ("gpm", "collective", "kernel"):
        got = gpu.get(key)
        if got is not None:
            lines.append(f"- {key}: {'ok' if got.get('ok') else 'NO'}" +
                         (f" ({got['error']})" if got.get("error") else ""))
    lines += [f"- PROBLEM: {p}" for p in pre.get("problems", [])]
    return lines


def markdown(doc: dict) -> str:
    title = f"{doc['device']}, dry run: the steps on CPU, no GPU measured" if doc["dry_run"] else doc["device"]
    lines = [f"# Device check ({title})", "",
             f"Everything that ran passed: {'yes' if doc['ok'] else 'NO'}. "
             f"{'Final' if doc['complete'] else 'PARTIAL (the check did not reach its end)'}; "
             f"{doc['elapsed_s']} s of the {doc['deadline_s']} s deadline.", "",
             "## Preflight", "", *preflight_lines(doc.get("preflight")), "",
             "## Steps", "", "| step | result | took s | budget s |", "|---|---|---|---|"]
    for s in doc["steps"]:
        result = (f"skipped: {s['skipped']}" if s["skipped"] else f"NOT RUN: {s['not_run']}" if s["not_run"] else
                  f"TIMED OUT (exit {s['exit_code']})" if s["timed_out"] else f"exit {s['exit_code']}")
        lines.append(f"| {s['step']} | {result} | {_cell(s['seconds'])} | {_cell(s['budget_s'])} |")
    lines += ["", "## Self-tests: measured against truth", "",
              "| self-test | measured | truth | unit | tolerance | passed | detail |", "|---|---|---|---|---|---|---|"]
    for t in doc["selftests"]:
        passed = {True: "yes", False: "NO", None: "not run"}[t.get("passed")]
        lines.append(f"| {t['name']} | {_cell(t.get('measured'))} | {_cell(t.get('truth'))} | "
                     f"{t.get('unit', '')} | {t.get('tolerance', '')} | {passed} | {t.get('detail', '')} |")
    if doc.get("runs"):
        lines += ["", "## Runs at world size 1", "", "| " + " | ".join(MD_RUN_KEYS) + " |",
                  "|" + "---|" * len(MD_RUN_KEYS)]
        lines += ["| " + " | ".join(_cell(r.get(k)) for k in MD_RUN_KEYS) + " |" for r in doc["runs"]]
        reasons = {r["sm_occupancy_reason"] for r in doc["runs"] if r.get("sm_occupancy_reason")}
        lines += [f"- SM occupancy: {why}" for why in sorted(reasons)]
        lines += ["", "## Run checks", "", "| run | check | verdict | detail |", "|---|---|---|---|"]
        lines += [f"| {r['trainer']} ({r['options']}) | {c['check']} | {c['verdict']} | {c['detail']} |"
                  for r in doc["runs"] for c in r.get("checks", [])]
    if doc.get("copy_verdicts"):
        lines += ["", "## What moved each copy's bytes (GPM SM utilization while it ran alone)", "",
                  "| source | copy | SM util | moved by |", "|---|---|---|---|"]
        lines += [f"| {c['source']} | {c['copy']} | {_cell(c.get('sm_util'))} | {c['moved_by']} |"
                  for c in doc["copy_verdicts"]["copies"]]
        lines += ["", f"- {doc['copy_verdicts']['finding']}"]
    lines += ["", "## Not checked on one GPU", ""] + [f"- {n}" for n in doc["not_checked"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    out_dir, device = Path(argv[0]), argv[1]
    steps_only = "--steps-only" in argv
    work = Path(argv[argv.index("--work") + 1]) if "--work" in argv else out_dir / "work"
    meta = read_json(work / "check.json") or {}
    doc = {"device": device, "dry_run": "--dry-run" in argv, "complete": not steps_only,
           "deadline_s": meta.get("deadline_s"), "elapsed_s": meta.get("elapsed_s"),
           "preflight": read_json(work / "preflight.json"), "steps": read_steps(out_dir / "steps.tsv"),
           "selftests": read_selftests(work), "runs": [] if steps_only else read_runs(work / "runs"),
           **({} if steps_only else read_extras(work)), "not_checked": list(NOT_CHECKED)}
    for run in doc["runs"]:
        run["checks"] = judge_run(run, doc["preflight"], cuda=device == "cuda")
    if not steps_only:
        doc["copy_verdicts"] = copy_verdicts(doc["selftests"], doc.get("sm_contention"))
    doc["ok"] = (all(s["exit_code"] == 0 for s in doc["steps"] if s["skipped"] is None and s["not_run"] is None)
                 and not any(s["not_run"] for s in doc["steps"])
                 and all(t.get("passed") is not False for t in doc["selftests"])
                 and all(c["verdict"] != "FAILED" for r in doc["runs"] for c in r["checks"]))
    (out_dir / "summary.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    (out_dir / "summary.md").write_text(markdown(doc))
    return 0 if doc["ok"] else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
