"""GPU busy time from Kineto traces, on fixtures whose answers are worked out by hand."""
import gzip
import json

import numpy as np
import pandas as pd
import pytest

from fsbench.measurement import kineto
from fsbench.measurement import metrics


def _step(k, ts, dur):
    return {"ph": "X", "cat": "user_annotation", "name": f"fsbench.step.{k}", "ts": ts, "dur": dur}


def _kernel(name, ts, dur, stream=7, cat="kernel", device=0):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur,
            "args": {"device": device, "stream": stream}}


EVENTS = [
    _step(0, 1000.0, 100.0), _step(1, 1100.0, 100.0),
    # step 0: two streams overlapping: [1000,1040] and [1020,1060] -> union 60 us
    _kernel("gemm", 1000.0, 40.0, stream=7), _kernel("gemm", 1020.0, 40.0, stream=8),
    # an NCCL kernel [1050,1090]: overlaps compute on [1050,1060] -> 10 us hidden
    _kernel("ncclDevKernel_AllReduce_Sum_f32", 1050.0, 40.0, stream=9),
    _kernel("Memcpy HtoD", 1090.0, 5.0, cat="gpu_memcpy"),
    # straddles the boundary: [1095,1115] -> 5 us in step 0, 15 us in step 1
    _kernel("elementwise", 1095.0, 20.0),
    # step 1: one more kernel [1150,1170]
    _kernel("softmax", 1150.0, 20.0),
    # another GPU's kernel, ignored for device 0
    _kernel("gemm", 1000.0, 90.0, device=1),
    # CPU-side noise
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1000.0, "dur": 50.0},
]


def test_union_and_overlap():
    a = np.array([[0, 4], [2, 6], [10, 12]], dtype=float)
    assert kineto.union_length(a) == 8
    assert kineto.overlap_length(a, np.array([[5, 11]], dtype=float)) == 2
    assert kineto.union_length(np.empty((0, 2))) == 0


def test_busy_is_the_union_of_compute_kernels_without_nccl():
    table = kineto.gpu_step_busy(EVENTS, device=0).set_index("step")
    assert table.loc[0, "busy_ns"] == (60 + 5) * 1000
    assert table.loc[0, "comm_ns"] == 40 * 1000
    assert table.loc[0, "comm_overlap_ns"] == 10 * 1000
    assert table.loc[0, "memcpy_ns"] == 5 * 1000
    assert table.loc[1, "busy_ns"] == (15 + 20) * 1000
    assert table.loc[1, "comm_ns"] == 0


def test_sm_free_transport_activity_is_communication_not_busy_or_copies():
    """The sm_free transport's symmetric-memory barrier spins on SMs while it waits for
    peers, and its pulls are peer-to-peer copies: both are communication. (Before, the
    barrier read as compute busy and the pulls as neither.)"""
    events = [_step(0, 0.0, 100.0), _kernel("gemm", 0.0, 30.0),
              _kernel("c10d::symmetric_memory::barrier_kernel(unsigned int**, int, int, int, "
                      "unsigned long)", 30.0, 20.0, stream=11),
              _kernel("Memcpy PtoP (Device -> Device)", 50.0, 25.0, cat="gpu_memcpy", stream=11),
              _kernel("Memcpy HtoD (Pinned -> Device)", 80.0, 5.0, cat="gpu_memcpy")]
    row = kineto.gpu_step_busy(events, device=0).iloc[0]
    assert row["busy_ns"] == 30_000, "only the GEMM is compute"
    assert row["comm_ns"] == 45_000, "barrier and peer pull"
    assert row["memcpy_ns"] == 5_000, "a host-to-device copy stays a copy"


def test_a_trace_without_step_annotations_is_refused():
    with pytest.raises(ValueError, match="no fsbench.step"):
        kineto.gpu_step_busy([_kernel("gemm", 0.0, 1.0)])


def test_a_run_dir_of_gzipped_traces_gives_busy_per_rank_and_step(tmp_path):
    for rank in (0, 1):
        events = [_step(0, 0.0, 100.0), _kernel("gemm", 0.0, 50.0 + 30 * rank)]
        with gzip.open(tmp_path / f"kineto-rank-{rank}.json.gz", "wt") as f:
            json.dump({"traceEvents": events}, f)
    busy = kineto.read_run_gpu_busy(tmp_path).set_index("rank")
    assert busy.loc[0, "busy_ns"] == 50_000 and busy.loc[1, "busy_ns"] == 80_000
    assert kineto.read_run_gpu_busy(tmp_path / "nothing") is None


def test_metrics_take_busy_and_exposed_comm_from_the_kernel_record():
    """CPU spans say the ranks were busy all step; the GPU record says 50 and 80 us of
    compute, and rank 0 had 20 us of communication not hidden by compute."""
    ms = 1_000_000
    spans = pd.DataFrame([
        {"rank": r, "step": 0, "warmup": False, "name": n, "kind": k, "start_ns": 0,
         "dur_ns": ms, "cpu_ns": ms, "runq_ns": 0}
        for r in (0, 1) for n, k in (("step", "step"), ("forward", "compute"))])
    gpu = pd.DataFrame([{"step": 0, "rank": 0, "busy_ns": 500_000, "comm_ns": 300_000,
                         "comm_overlap_ns": 100_000},
                        {"step": 0, "rank": 1, "busy_ns": 800_000, "comm_ns": 0,
                         "comm_overlap_ns": 0}])
    row = metrics.step_metrics(spans, gpu).iloc[0]
    assert row["busy_max_ms"] == pytest.approx(0.8)
    assert row["bubble_ratio"] == pytest.approx((0.5 + 0.2) / 2)
    assert row["straggler_bubble_ratio"] == pytest.approx(0.3 / 2)
    # rank 0's 0.2 ms of exposed comm kernels all went to the straggler gap (0.3 ms)
    assert row["exposed_comm_ratio"] == pytest.approx(0.0)


def test_the_real_profiler_export_is_parsed(tmp_path):
    """torch.profiler on CPU writes the same Chrome trace format; its step windows must be
    found (no GPU here, so no kernels: busy 0)."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for k in range(2):
            with record_function(f"fsbench.step.{k}"):
                torch.ones(64, 64) @ torch.ones(64, 64)
    path = tmp_path / "kineto-rank-0.json"
    prof.export_chrome_trace(str(path))
    table = kineto.gpu_step_busy(kineto.load_trace(path))
    assert table["step"].tolist() == [0, 1]
    assert (table["window_end_us"] > table["window_start_us"]).all()
    assert (table["busy_ns"] == 0).all()


def test_profiled_steps_give_the_bubble_and_the_others_the_step_time():
    """A CUDA run's last measured step ran under the profiler: 40 ms instead of 10 (the
    profiler's host overhead), kernels busy 30 ms. Step time and throughput come from the
    unprofiled steps, the bubble from the profiled one; the unprofiled steps keep their
    own busy time (today's code zeroed it wherever the kernel record had no row)."""
    ms = 1_000_000
    rows = []
    for step, t, profiled in ((0, 50, False), (1, 10, False), (2, 10, False), (3, 40, True)):
        for r in (0, 1):
            for name, kind in (("step", "step"), ("forward", "compute")):
                rows.append({"rank": r, "step": step, "warmup": step == 0, "name": name,
                             "kind": kind, "start_ns": step * 100 * ms, "dur_ns": t * ms,
                             "cpu_ns": t * ms, "runq_ns": 0, "profiled": profiled})
    spans = pd.DataFrame(rows)
    gpu = pd.DataFrame([{"step": 3, "rank": r, "busy_ns": 30 * ms, "comm_ns": 0,
                         "comm_overlap_ns": 0} for r in (0, 1)])
    stats = pd.DataFrame([{"rank": r, "step": s, "loss": 1.0, "num_samples": 4, "num_targets": 8}
                          for s in range(4) for r in (0, 1)])
    out = metrics.summarize(spans, stats, gpu)
    assert (out["steps_measured"], out["steps_profiled"], out["steps_timed"]) == (3, 1, 2)
    assert out["step_time_ms_median"] == pytest.approx(10)
    assert out["samples_per_s"] == pytest.approx(8 / 0.010)
    assert out["bubble_ratio"] == pytest.approx(10 / 40)
    table = metrics.step_metrics(spans, gpu).set_index("step")
    assert table.loc[1, "busy_max_ms"] == pytest.approx(10)  # not zeroed
    assert table.loc[3, "busy_max_ms"] == pytest.approx(30)
