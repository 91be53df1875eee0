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
    # The profiler's cost is measured beside the bubble: 30 of the profiled step's 40 ms.
    assert out["profiler_overhead_ms"] == pytest.approx(30)
    assert out["profiler_overhead_ratio"] == pytest.approx(0.75)


def _launch(corr, ts, tid=1, name="cudaMemcpyAsync"):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": 2.0, "pid": 1,
            "tid": tid, "args": {"correlation": corr}}


def _copy(corr, ts, dur, stream, name="Memcpy DtoD (Device -> Device)"):
    return {"ph": "X", "cat": "gpu_memcpy", "name": name, "ts": ts, "dur": dur,
            "args": {"device": 0, "stream": stream, "correlation": corr}}


def test_copies_launched_as_communication_are_communication_by_their_stream():
    """The sm_free transport's pulls are copy_ from a symmetric buffer mapped on the local
    device: CUPTI calls them device-to-device, not peer-to-peer. Launched inside a
    `fsbench.comm.` annotation onto the transport's own stream, they are communication;
    so is anything else on that stream (no launch record), while a device-to-device copy
    on the compute stream stays a copy. (Before: every one of them was a copy.)"""
    events = [_step(0, 0.0, 200.0),
              {"ph": "X", "cat": "user_annotation", "name": "fsbench.comm.sm_free.pull",
               "ts": 10.0, "dur": 10.0, "pid": 1, "tid": 1},
              _launch(41, 12.0), _launch(42, 15.0),
              _copy(41, 30.0, 20.0, stream=20), _copy(42, 50.0, 10.0, stream=20),
              _copy(None, 70.0, 5.0, stream=20),  # on the transport's stream, launch unknown
              _launch(43, 25.0), _copy(43, 100.0, 10.0, stream=7),  # the compute stream's own copy
              # the same thread's launch outside the annotation's interval: not communication
              _launch(44, 40.0, name="cudaLaunchKernel"),
              _kernel("gemm", 100.0, 50.0, stream=7) | {"args": {"device": 0, "stream": 7,
                                                                "correlation": 44}}]
    kinds = kineto.kernel_intervals(events, device=0).groupby("stream")["kind"].agg(set)
    assert kinds[20] == {"comm"} and kinds[7] == {"memcpy", "compute"}
    row = kineto.gpu_step_busy(events, device=0).iloc[0]
    assert (row["comm_ns"], row["memcpy_ns"], row["busy_ns"]) == (35_000, 10_000, 50_000)


def test_a_comm_annotation_around_compute_stream_work_marks_only_that_work():
    """A launch on the compute stream inside the annotation (the hazard comm_launch names)
    is communication by its launch, but does not turn the compute stream's other work
    into communication: a stream counts as communication only if it carries nothing
    launched outside such an annotation."""
    events = [_step(0, 0.0, 200.0),
              {"ph": "X", "cat": "user_annotation", "name": "fsbench.comm.x", "ts": 0.0,
               "dur": 5.0, "pid": 1, "tid": 1},
              _launch(1, 1.0), _copy(1, 10.0, 10.0, stream=7),
              _launch(2, 50.0, name="cudaLaunchKernel"),
              _kernel("gemm", 60.0, 40.0, stream=7) | {"args": {"device": 0, "stream": 7, "correlation": 2}}]
    row = kineto.gpu_step_busy(events, device=0).iloc[0]
    assert (row["comm_ns"], row["busy_ns"]) == (10_000, 40_000)


def _cuda_spans(steps, busy_event_ms, profiled=()):
    """One rank, `steps` of 10 ms, each with a compute span whose CUDA-event time is
    busy_event_ms."""
    ms = 1_000_000
    return pd.DataFrame([
        {"rank": 0, "step": s, "warmup": s == 0, "name": n, "kind": k, "start_ns": s * 100 * ms,
         "dur_ns": 10 * ms, "cpu_ns": 10 * ms, "runq_ns": 0, "profiled": s in profiled,
         "gpu_ns": busy_event_ms * ms if k == "compute" else None}
        for s in range(steps) for n, k in (("step", "step"), ("forward", "compute"))])


def test_a_profiled_step_without_kernels_keeps_its_event_time_with_a_note():
    """The profiler recorded no kernel in step 2's window (reproduced with torch 2.11 on
    CPU): its zeros are no measurement. Its busy time stays the CUDA events' 6 of 10 ms,
    not 0 (a step of pure bubble, as before), and the summary says which step fell back."""
    from fsbench.measurement import profiled

    spans = _cuda_spans(4, 6, profiled=(1, 2))
    gpu = pd.DataFrame([{"step": 1, "rank": 0, "busy_ns": 8_000_000, "comm_ns": 0, "comm_overlap_ns": 0,
                         "kernels": 12},
                        {"step": 2, "rank": 0, "busy_ns": 0, "comm_ns": 0, "comm_overlap_ns": 0,
                         "kernels": 0}])
    table = metrics.step_metrics(spans, gpu).set_index("step")
    assert table.loc[1, "busy_max_ms"] == pytest.approx(8)
    assert table.loc[2, "busy_max_ms"] == pytest.approx(6)
    assert table.loc[2, "bubble_ratio"] == pytest.approx(0.4)
    source = profiled.busy_source(gpu, {1, 2}, events=True)
    assert source["busy_source"] == "kineto+cuda_events"
    assert "step(s) 2 had no kernel" in source["busy_source_note"]
    assert profiled.busy_source(gpu[gpu["step"] == 1], {1}, events=True) == {
        "busy_source": "kineto", "busy_source_note": None}
    assert profiled.busy_source(None, set(), events=True)["busy_source"] == "cuda_events"


def test_hidden_communication_comes_from_the_kernel_record_when_it_gives_busy_time():
    """On CUDA a flight is GPU time between two events while a compute span is a host
    launch window: the flight below sits wholly under the forward span (100% hidden by
    those two clocks), but the kernel record says a quarter of the communication-kernel
    time ran under compute kernels. The summary takes the record's 25%, and says so."""
    ms = 1_000_000
    spans = _cuda_spans(4, 6, profiled=(1,))
    flights = pd.DataFrame([{"rank": 0, "step": s, "warmup": False, "name": "emb", "kind": "flight",
                             "start_ns": s * 100 * ms + ms, "dur_ns": 2 * ms, "cpu_ns": 0,
                             "runq_ns": 0, "profiled": False} for s in (1, 2, 3)])
    spans = pd.concat([spans, flights], ignore_index=True)
    gpu = pd.DataFrame([{"step": 1, "rank": 0, "busy_ns": 6 * ms, "comm_ns": 4 * ms,
                         "comm_overlap_ns": ms, "kernels": 9}])
    stats = pd.DataFrame([{"rank": 0, "step": s, "loss": 1.0, "num_samples": 4, "num_targets": 8}
                          for s in range(4)])
    out = metrics.summarize(spans, stats, gpu)
    assert (out["comm_overlap_ratio"], out["comm_overlap_source"]) == (pytest.approx(0.25), "kineto")
    # the same CUDA run without a kernel record (no profiled window, or no kernels in it):
    # no figure and a note saying why, never flights against host spans (two clocks)
    for gpu_busy in (None, gpu.assign(busy_ns=0, comm_ns=0, comm_overlap_ns=0, kernels=0)):
        out = metrics.summarize(spans.assign(profiled=gpu_busy is not None and spans["step"].eq(1)),
                                stats, gpu_busy)
        assert (out["comm_overlap_ratio"], out["comm_overlap_source"]) == (None, None)
        assert out["comm_overlap_note"].startswith("CUDA run with no"), out["comm_overlap_note"]
    # a CPU run (thread CPU time, no CUDA events): flights against compute spans
    out = metrics.summarize(spans.assign(profiled=False, gpu_ns=None), stats)
    assert (out["comm_overlap_ratio"], out["comm_overlap_source"]) == (pytest.approx(1.0), "flights")


def test_a_cuda_run_reports_the_bubble_on_the_timed_steps_clock_and_its_copies():
    """Profiled steps stretched to 40 ms by the profiler with 20 ms busy and 4 ms of copies;
    timed steps of 25 ms. Beside the profiled bubble (1 - 20/40), the timed-clock bubble is
    1 - 20/25, and memcpy_ratio the copies' share of the profiled steps (before: neither
    was reported, and copies hid in other idle). CPU runs have neither."""
    ms = 1_000_000
    rows = []
    for step, t, profiled in ((0, 50, False), (1, 40, True), (2, 40, True), (3, 25, False), (4, 25, False)):
        for name, kind in (("step", "step"), ("forward", "compute")):
            rows.append({"rank": 0, "step": step, "warmup": step == 0, "name": name, "kind": kind,
                         "start_ns": step * 100 * ms, "dur_ns": t * ms, "cpu_ns": t * ms, "runq_ns": 0,
                         "profiled": profiled, "gpu_ns": 20 * ms if kind == "compute" else None})
    spans = pd.DataFrame(rows)
    gpu = pd.DataFrame([{"step": s, "rank": 0, "busy_ns": 20 * ms, "comm_ns": 0, "comm_overlap_ns": 0,
                         "memcpy_ns": 4 * ms, "kernels": 5} for s in (1, 2)])
    stats = pd.DataFrame([{"rank": 0, "step": s, "loss": 1.0, "num_samples": 4, "num_targets": 8}
                          for s in range(5)])
    out = metrics.summarize(spans, stats, gpu)
    assert out["bubble_ratio"] == pytest.approx(0.5)
    assert out["bubble_ratio_timed"] == pytest.approx(1 - 20 / 25)
    assert out["memcpy_ratio"] == pytest.approx(4 / 40)
    cpu = metrics.summarize(spans.assign(profiled=False, gpu_ns=None), stats)
    assert cpu["bubble_ratio_timed"] is None and cpu["memcpy_ratio"] is None
