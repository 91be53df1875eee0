"""The CUDA measurements against truths known on one GPU (fsbench.measurement.selftests,
freescale_impl.transport_selftest, fsbench.running.groundtruth.cuda_selftest): the same
code the device check runs (scripts/gpu_selftests.py). Each fails on a wrong reading;
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
