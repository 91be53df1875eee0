"""The CPU-speed probe's reading of a run's spans (fsbench.measurement.speed_probe)."""
import pandas as pd
import pytest

from fsbench.measurement.speed_probe import PROBE_SPAN, WINDOW_STEPS, probe_ns_per_step


def probes(cpu_ns, overhead_ns=None, ranks=2):
    rows = [{"rank": r, "step": k, "name": PROBE_SPAN, "cpu_ns": c,
             **({} if overhead_ns is None else {"overhead_ns": overhead_ns[k]})}
            for k, c in enumerate(cpu_ns) for r in range(ranks)]
    return pd.DataFrame(rows + [{"rank": 0, "step": 0, "name": "forward", "cpu_ns": 10**9,
                                 **({} if overhead_ns is None else {"overhead_ns": 0})}])


def test_each_step_reads_the_median_probe_of_its_window():
    speeds = [1000.0, 1000.0, 5000.0, 1000.0, 1000.0, 1000.0]
    out = probe_ns_per_step(probes(speeds))
    assert WINDOW_STEPS == 5 and out[2] == 1000.0  # one slow probe does not make a step
    assert list(out.index) == list(range(len(speeds)))


def test_an_emulated_run_reads_the_probe_real_cpu_from_overhead_ns():
    """compute=emulated books a span's emulated compute as cpu_ns (none in the probe) and
    its real thread CPU as overhead_ns: the probe is that real CPU, never 0 (a step time
    over 0 was inf, and every emulated run's step_time_norm_median NaN)."""
    out = probe_ns_per_step(probes([0] * 6, overhead_ns=[800_000] * 6))
    assert out is not None and (out == 800_000).all()


def test_a_run_whose_probes_measured_no_cpu_has_no_speed():
    assert probe_ns_per_step(probes([0] * 6)) is None
    assert probe_ns_per_step(pd.DataFrame({"name": ["forward"], "step": [0], "cpu_ns": [5]})) is None


@pytest.mark.parametrize("overhead", [None, [0] * 6])
def test_a_real_run_reads_cpu_ns(overhead):
    out = probe_ns_per_step(probes([700_000] * 6, overhead_ns=overhead))
    assert (out == 700_000).all()
