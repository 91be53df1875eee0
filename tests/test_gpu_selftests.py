"""The CUDA measurements against truths known on one GPU (fsbench.measurement.selftests,
fsbench.measurement.copy_engines, freescale_impl.transport_selftest,
fsbench.running.groundtruth.cuda_selftest), and the device check's preflight probes and
CUDA calibration: the same code the device check runs (scripts/gpu_selftests.py,
scripts/gpu_preflight.py, fsbench calibrate). Each fails on a wrong reading;
without a CUDA device each is skipped, saying so. NOT YET RUN ON A GPU."""
import pytest
import torch

from fsbench.measurement import selftests
from fsbench.measurement.device_sleep import sleep_kernel

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA device: these check CUDA measurements against known device work")]


@pytest.fixture(scope="module")
def device():
    return torch.device("cuda", 0)


@pytest.fixture(scope="module")
def sleep(device):
    return sleep_kernel(device)


def _check(result: selftests.SelfTest) -> None:
    assert result.passed, (f"{result.name}: measured {result.measured} {result.unit} against "
                           f"{result.truth} ({result.tolerance}); {result.detail}")


def test_a_flight_completed_through_a_future_reads_its_known_device_delay(device, tmp_path, sleep):
    _check(selftests.flight_of_known_delay(device, tmp_path, sleep))


def test_a_compute_span_reads_the_length_of_its_kernels_not_of_their_launch(device, tmp_path, sleep):
    _check(selftests.compute_span_of_known_kernels(device, tmp_path, sleep))


def test_a_planted_host_sync_is_counted_once(device):
    _check(selftests.planted_host_sync_counted_once(device))


def test_kineto_busy_time_is_the_known_kernels_and_not_the_gaps(device, tmp_path, sleep):
    _check(selftests.kineto_busy_of_known_sequence(device, tmp_path, sleep))


def test_sm_occupancy_is_high_under_a_wide_kernel_and_about_zero_idle(device):
    result = selftests.sm_occupancy_busy_and_idle(device)
    if result.passed is None:
        pytest.skip(f"no GPM reading on this GPU: {result.detail}")
    _check(result)


def test_the_copy_engine_transports_copies_are_communication_by_their_stream(device, tmp_path):
    from freescale_impl.transport_selftest import sm_free_copies_are_communication

    result = sm_free_copies_are_communication(device, tmp_path)
    if result.passed is None:
        pytest.skip(result.detail)
    _check(result)


def test_the_ground_truth_workloads_on_cuda_are_within_tolerance_of_closed_form(tmp_path):
    from fsbench.running.groundtruth import cuda_selftest

    _check(cuda_selftest(tmp_path))


def test_the_sleep_kernel_runs_its_nominal_lengths_after_a_warm_calibration(device, sleep):
    _check(selftests.sleep_lengths_match_nominal(device, sleep))


def _verdict_or_skip(result: selftests.SelfTest) -> None:
    if result.passed is None:
        pytest.skip(result.detail)
    _check(result)


def test_what_moves_a_same_gpu_and_a_pinned_copy_is_measured_with_both_controls_holding(device):
    from fsbench.measurement.copy_engines import copies_on_copy_engines

    result = copies_on_copy_engines(device)
    _verdict_or_skip(result)
    assert {c["copy"] for c in result.record["copies"]} == {"sm_kernel_copy", "same_gpu_copy", "pinned_h2d_copy"}


def test_an_sm_free_exchange_never_syncs_the_host(device):
    from freescale_impl.transport_selftest import sm_free_exchange_never_syncs

    _verdict_or_skip(sm_free_exchange_never_syncs(device))


def test_the_one_rank_sm_free_pull_gets_a_verdict_on_what_moves_it(device):
    from freescale_impl.transport_selftest import sm_free_pull_sm_util

    result = sm_free_pull_sm_util(device)
    _verdict_or_skip(result)
    assert result.record["copies"][0]["moved_by"] in ("copy engine", "SM")


def test_a_failing_transport_self_test_frees_its_symmetric_memory_and_nccl_group(device):
    import torch.distributed as dist

    from freescale_impl.transport import sm_free_unavailable
    from freescale_impl.transport_selftest import one_rank_transport

    why = sm_free_unavailable(device, 1)
    if why:
        pytest.skip(why)
    with pytest.raises(RuntimeError, match="half-way"):
        with one_rank_transport(device) as transport:
            assert dist.get_backend() == "nccl"
            raise RuntimeError("failed half-way")
    assert transport.buffer is None and transport.handle is None and not dist.is_initialized()


def test_the_preflight_runs_a_one_rank_nccl_all_reduce_a_kernel_and_two_gpm_samples():
    import importlib.util
    from pathlib import Path

    from fsbench.measurement.nvml import gpm_probe

    path = Path(__file__).resolve().parents[1] / "scripts" / "gpu_preflight.py"
    spec = importlib.util.spec_from_file_location("gpu_preflight", path)
    preflight = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(preflight)
    assert preflight.one_rank_all_reduce("cuda:0") == {"backend": "nccl", "value": 2048.0}
    assert preflight.one_kernel("cuda:0")["value"] > 0
    probe = gpm_probe(0)
    assert probe["ok"] or probe["error"], probe  # a reading, or NVML's reason for none
    if probe["ok"]:
        assert probe["sm_util"] is not None


def test_the_replicated_tables_calibration_on_cuda_runs_ddp_over_nccl():
    import dataclasses

    from torch.profiler import ProfilerActivity, profile

    from fsbench.costmodel.timing import measure_replicated_ns_per_element
    from fsbench.workloads.presets import tiny

    w = dataclasses.replace(tiny(), item_vocab=20_000)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ns = measure_replicated_ns_per_element(w, device="cuda", repeats=2)
    ops = {e.name for e in prof.events()}
    assert ns > 0 and "torch.distributed.ddp.reducer::copy_bucket_to_grad" in ops
    assert "nccl:all_reduce" in ops, sorted(o for o in ops if "nccl" in o.lower())
