"""The device check's report and preflight judge what ran (scripts/gpu_check_summary.py,
scripts/gpu_preflight.py): a dry run says it is one, each run gets checks beyond
completing, what moved each copy's bytes is stated with what follows for the sm_free
transport, what one GPU cannot prove is listed in the report and the docs, and the
preflight's probes run (on CPU: gloo and a CPU op; on a GPU: tests/test_gpu_selftests.py)."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


summary = _script("gpu_check_summary")
preflight = _script("gpu_preflight")


def test_a_dry_runs_report_says_it_is_one_in_its_title(tmp_path):
    (tmp_path / "steps.tsv").write_text("preflight\t0\t5\t25\n")
    work = tmp_path / "elsewhere"
    work.mkdir()
    assert summary.main([str(tmp_path), "cpu", "--work", str(work), "--steps-only", "--dry-run"]) == 0
    title = (tmp_path / "summary.md").read_text().splitlines()[0]
    assert "dry run" in title, title
    summary.main([str(tmp_path), "cuda", "--work", str(work), "--steps-only"])
    assert "dry run" not in (tmp_path / "summary.md").read_text().splitlines()[0]


def _run(**over) -> dict:
    run = {"trainer": "freescale", "options": "defaults", "transport": "collective", "status": "complete",
           "busy_source": "kineto", "busy_source_note": None, "steps_profiled": 8,
           "sm_occupancy": 0.41, "sm_occupancy_reason": None, "host_syncs_fwd_bwd_per_step": 0.0}
    return {**run, **over}


def _verdicts(checks) -> dict:
    return {c["check"]: c["verdict"] for c in checks}


GPM = {"gpu": {"gpm": {"ok": True, "error": None, "environment": False}}}
HIDDEN = {"gpu": {"gpm": {"ok": False, "error": "GPM sampling failed (Insufficient Permissions)",
                          "environment": True}}}


def test_each_cuda_run_is_judged_beyond_completing():
    """Before, a run passed by completing. Now its busy time must be the kernel record's,
    a step profiled, SM occupancy there where preflight found GPM, and FreeScale over the
    collective transport free of host syncs in forward and backward."""
    assert set(_verdicts(summary.judge_run(_run(), GPM, cuda=True)).values()) == {"passed"}
    bad = _verdicts(summary.judge_run(_run(busy_source="cuda_events", steps_profiled=0, sm_occupancy=None,
                                           host_syncs_fwd_bwd_per_step=2.0), GPM, cuda=True))
    assert bad == {"completed": "passed", "busy from Kineto": "FAILED", "a profiled step": "FAILED",
                   "SM occupancy": "FAILED", "no host sync in fwd/bwd": "FAILED"}
    hidden = _verdicts(summary.judge_run(_run(sm_occupancy=None), HIDDEN, cuda=True))
    assert hidden["SM occupancy"].startswith("not run: environment: GPM sampling failed")
    sm_free = _verdicts(summary.judge_run(_run(transport="sm_free", host_syncs_fwd_bwd_per_step=8.0), GPM,
                                          cuda=True))
    assert "no host sync in fwd/bwd" not in sm_free  # its exchanges sync once each, by design
    assert "no host sync in fwd/bwd" not in _verdicts(summary.judge_run(_run(trainer="ddp"), GPM, cuda=True))


def test_a_dry_runs_checks_are_not_run_and_say_why_never_passed():
    checks = _verdicts(summary.judge_run(_run(busy_source="thread_cpu_time"), None, cuda=False))
    assert checks.pop("completed") == "passed"
    assert checks and all(v.startswith("not run: CPU run") for v in checks.values())


def test_a_failed_run_check_fails_the_report(tmp_path, monkeypatch):
    (tmp_path / "steps.tsv").write_text("run-freescale\t0\t9\t40\n")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "preflight.json").write_text(json.dumps(GPM))
    monkeypatch.setattr(summary, "read_runs", lambda store: [_run(busy_source="cuda_events")])
    assert summary.main([str(tmp_path), "cuda"]) == 3
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert not doc["ok"] and "| busy from Kineto | FAILED |" in (tmp_path / "summary.md").read_text()


def _selftest(name, copies) -> dict:
    return {"name": name, "passed": True, "record": {"copies": copies}}


def test_what_moved_each_copy_is_stated_and_an_sm_pull_limits_the_transports_claim():
    from fsbench.measurement.copy_engines import judged

    tests = [_selftest("copies_on_copy_engines", [judged("same_gpu_copy", 0.7, None),
                                                  judged("pinned_h2d_copy", 0.0, None)]),
             _selftest("sm_free_pull_sm_util", [judged("sm_free_pull", 0.55, None)])]
    micro = [{"conditions": {"alone": {}, "ce_d2d": {"moved_by": "SM", "moved_by_claimed": "copy engine",
                                                     "copy_sm_util_alone": 0.7}}}]
    found = summary.copy_verdicts(tests, micro)
    assert [(c["copy"], c["moved_by"]) for c in found["copies"]] == [
        ("same_gpu_copy", "SM"), ("pinned_h2d_copy", "copy engine"), ("sm_free_pull", "SM"), ("ce_d2d", "SM")]
    assert "hold only between GPUs" in found["finding"]
    tests[1] = _selftest("sm_free_pull_sm_util", [judged("sm_free_pull", 0.01, None)])
    assert "ran on copy engines" in summary.copy_verdicts(tests, None)["finding"]
    assert "not measured" in summary.copy_verdicts([], None)["finding"]


@pytest.mark.parametrize("words", [
    "straggler and imbalance attribution on GPU", "clocks across ranks",
    "whether sm_free is SM-free at all between GPUs"])
def test_what_one_gpu_cannot_prove_is_in_every_report_and_in_the_docs(words):
    assert any(words in line for line in summary.NOT_CHECKED)
    doc = " ".join((ROOT / "docs" / "gpu.md").read_text().split())
    assert words.lower() in doc.lower(), words


def test_the_preflight_probes_a_world_of_one_a_kernel_and_gpm():
    """On CPU the probes run on gloo and a CPU op (their code path); GPM is absent here,
    which is the environment's limit, recorded and no reason to stop."""
    assert preflight.attempt(lambda: preflight.one_rank_all_reduce("cpu")) | {"seconds": 0} == {
        "ok": True, "backend": "gloo", "value": 2048.0, "seconds": 0}
    assert preflight.attempt(lambda: preflight.one_kernel("cpu"))["ok"]
    failed = preflight.attempt(lambda: 1 / 0)
    assert not failed["ok"] and failed["error"].startswith("ZeroDivisionError")
    from fsbench.measurement.nvml import gpm_probe

    probe = gpm_probe(0)
    assert not probe["ok"] and probe["environment"] and probe["error"]
