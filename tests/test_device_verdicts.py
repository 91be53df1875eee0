"""The device check's judgements that do not need a GPU to be right: the sleep kernel's
warm calibration, what a copy's SM utilization says about its engine, which missing
readings are the environment's rather than failures, and which ground-truth rows one
rank cannot check. The GPU runs them in tests/test_gpu_selftests.py."""
import math

import pandas as pd
import pytest

from fsbench.measurement import copy_engines, device_sleep, nvml, selftests
from fsbench.running import groundtruth


class _RampingClock:
    """Timings of CYCLES-cycle sleeps while an SM clock ramps from 345 MHz towards 1,980
    MHz and holds (an H100 after idling); what `calibrate` is given to time."""

    def __init__(self, mhz=(345, 700, 1200, 1700, 1900, 1975, 1980)) -> None:
        self.mhz, self.calls, self.warmed = list(mhz), 0, False

    def warm(self) -> None:
        self.warmed = True

    def time_cycles(self, cycles: int) -> float:
        assert self.warmed, "timed before the warm-up"
        mhz = self.mhz[min(self.calls // device_sleep.ROUND, len(self.mhz) - 1)]
        self.calls += 1
        return cycles / (mhz * 1e3)  # ms


def test_the_sleep_kernel_is_calibrated_once_two_medians_agree_and_not_on_the_first():
    """A calibration at the first round (the old one: once, at step 0) reads 345 MHz, and a
    sleep asked for 10 ms would run 1.7 ms on the loaded GPU. This one warms first, then
    times rounds until two medians agree within 1%: 1,975 then 1,980 MHz."""
    clock = _RampingClock()
    cal = device_sleep.calibrate(clock.time_cycles, clock.warm)
    assert cal["settled"] and cal["rounds"] == 7
    assert cal["cycles_per_ms"] == pytest.approx(1980e3)
    assert abs(cal["medians_ms"][-1] / cal["medians_ms"][-2] - 1) <= device_sleep.AGREE


def test_a_clock_that_never_settles_is_said_so():
    clock = _RampingClock(mhz=[345 * 1.05 ** i for i in range(40)])
    cal = device_sleep.calibrate(clock.time_cycles, clock.warm)
    assert not cal["settled"] and cal["rounds"] == device_sleep.MAX_ROUNDS


def test_a_copy_is_on_a_copy_engine_only_where_the_sms_stayed_idle():
    assert copy_engines.verdict(0.0) == "copy engine"
    assert copy_engines.verdict(copy_engines.CE_MAX_SM_UTIL) == "copy engine"
    assert copy_engines.verdict(0.3) == "SM"
    assert copy_engines.verdict(None) == "unverified"
    assert copy_engines.burst(0.09) == 222 and copy_engines.burst(5.0) == 4 and copy_engines.burst(50.0) == 1


def test_without_gpm_a_copy_has_no_reading_and_nvmls_reason():
    util, why = copy_engines.sm_util_while("cpu", lambda: pytest.fail("copied without a GPU to sample"))
    assert util is None and nvml.environment_limit(why), why


@pytest.mark.parametrize("reason, environment", [
    ("no GPU: NVML library not found (libnvidia-ml.so.1)", True),
    ("GPM not supported on Tesla T4", True),
    ("GPM sampling failed (Insufficient Permissions)", True),
    ("GPM setup failed on NVIDIA H100 80GB HBM3 (Not Supported)", True),
    ("nvmlGpmSampleGet failed (In use by another client)", True),
    ("no GPM window completed: the sampled steps lasted 80 ms", False),
    ("no reading", False),
    (None, False),
])
def test_a_counter_the_host_hides_is_the_environments_not_a_failure(reason, environment):
    assert nvml.environment_limit(reason) is environment


def _monitor(occ=None, util=None, reason=None) -> dict:
    return {"sm_occupancy": occ, "sm_util": util, "sm_occupancy_reason": reason}


def test_the_occupancy_self_test_is_not_run_where_the_host_hides_the_counters():
    """Before, a Hopper whose counters the container hides read FAILED, as if the code were
    broken; it is "not run: environment" now. A GPU with GPM that gave no reading still fails."""
    hidden = selftests.judge_occupancy(_monitor(reason="GPM sampling failed (Insufficient Permissions)"),
                                       _monitor())
    assert hidden.passed is None and hidden.detail.startswith("not run: environment")
    silent = selftests.judge_occupancy(_monitor(reason="no GPM window completed"), _monitor())
    assert silent.passed is False
    good = selftests.judge_occupancy(_monitor(60.0, 95.0), _monitor(0.0, 1.0))
    assert good.passed and good.measured == pytest.approx(0.6)
    idle_busy = selftests.judge_occupancy(_monitor(60.0, 95.0), _monitor(20.0, 30.0))
    assert idle_busy.passed is False


def test_at_one_rank_straggler_and_imbalance_rows_are_not_checked_never_passes():
    """At one rank both compare 0 with 0: the rows say so, are neither judged nor ok, and
    the CUDA self-test passes or fails on the other rows alone (before: counted as passes)."""
    row = groundtruth.judge("straggler_bubble_ratio", 0.0, 0.0, 1, 0.0, 0.0)
    assert (row["judged"], row["ok"]) == (False, None) and "one rank" in row["not_checked"]
    assert groundtruth.judge("straggler_bubble_ratio", 0.0, 0.0, 2, 0.0, 0.0)["ok"] is True
    assert groundtruth.judge("bubble_ratio", 0.5, 0.5, 1, 0.0, 0.0)["not_checked"] is None
    rows = [{"case": "balanced", **groundtruth.judge(m, 0.1, 0.1 + err, 1, 0.0, 0.0)}
            for m, err in (("bubble_ratio", 0.01), ("straggler_bubble_ratio", 0.0),
                           ("load_imbalance", 0.0), ("other_idle_ratio", 0.02))]
    test = groundtruth.judge_cuda_table(pd.DataFrame(rows))
    assert test.passed and "not checked at one rank: load_imbalance, straggler_bubble_ratio" in test.detail
    assert test.measured == pytest.approx(0.02)
    rows[0] = {"case": "balanced", **groundtruth.judge("bubble_ratio", 0.1, 0.2, 1, 0.0, 0.0)}
    assert groundtruth.judge_cuda_table(pd.DataFrame(rows)).passed is False
    only_unchecked = pd.DataFrame([r for r in rows if r["not_checked"]])
    assert groundtruth.judge_cuda_table(only_unchecked).passed is False  # nothing checked: no pass
    assert math.isnan(rows[1]["budget"])
