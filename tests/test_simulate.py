"""fsbench simulate: the calibrated model's arithmetic on the real sampled batches, its
labels, and the alpha-beta fit of `calibrate --comm`."""
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from fsbench.cli import main
from fsbench.scaling.commcal import fit as fit_comm
from fsbench.config import RunConfig
from fsbench.scaling.sim_inputs import CLUSTERS, SimProfile
from fsbench.scaling.sim_costs import Costs
from fsbench.scaling.simulate import profile_of, simulate_run
from fsbench.training.step_program import Bucket
from fsbench.running.store import load_runs
from fsbench.workloads.generator import SyntheticBatches
from fsbench.workloads.presets import get_workload

from timing import first_quiet_try, judged_under_contention

H100 = CLUSTERS["h100"]
H100_ONE_WORKER = dataclasses.replace(H100, input_workers=1)  # the stage's pace is its own time
# A cluster whose compute dominates its communication (about a CPU core's FLOPs, H100 links):
# what the split does is then what the bubble shows.
SLOW = dataclasses.replace(H100, name="slow", peak_tflops=0.05, layer_overhead_ms=0.0, sm_slowdown=0.0,
                           table_ns_per_element=0.0)


def small(global_batch: int, steps: int = 6):
    return dataclasses.replace(get_workload("small"), global_batch_size=global_batch,
                               steps=steps, warmup=1)


def test_one_rank_takes_the_sum_of_its_samples_costs():
    w = small(64)
    summary, rows = simulate_run(RunConfig(workload=w, trainer="ddp", world_size=1), SLOW, ".")
    costs = Costs(SLOW, w, ".")
    source = SyntheticBatches(w, seed=0)
    for row in rows:  # no communication at one rank: T is the batch's compute
        expected = costs.sample_ms(source.global_batch(row["step"]).lengths.numpy()).sum()
        assert row["step_time_ms"] == pytest.approx(expected, rel=1e-12)
    assert summary["bubble_ratio"] == pytest.approx(0.0, abs=1e-12)
    assert summary["simulated"] is True


def test_freescale_balances_and_hides_what_ddp_cannot():
    # The step alone: its input stage (planning and routing, timed on this CPU) is another
    # test's (test_a_routing_slower_than_the_step_is_input_stall).
    w = small(64 * 8)
    ddp, _ = simulate_run(RunConfig(workload=w, trainer="ddp", world_size=64), SLOW, ".",
                          planner_time=False)
    fs, _ = simulate_run(RunConfig(workload=w, trainer="freescale", world_size=64), SLOW, ".",
                         planner_time=False)
    assert ddp["straggler_bubble_ratio"] > 0.2  # heavy-tailed lengths, contiguous split
    assert fs["straggler_bubble_ratio"] < ddp["straggler_bubble_ratio"] / 2
    assert fs["bubble_ratio"] < ddp["bubble_ratio"]
    # No split of whole samples beats the bound; FreeScale's straggler share sits above it.
    assert fs["straggler_bubble_ratio"] >= fs["whole_sample_bound_bubble"] - 1e-9
    # Each technique is a switch: with balancing off FreeScale splits like DDP (the same
    # loads; its step time differs by its exchange).
    off, _ = simulate_run(RunConfig(workload=w, trainer="freescale", world_size=64,
                                    trainer_options={"balance": "off"}), SLOW, ".")
    assert off["load_imbalance"] == pytest.approx(ddp["load_imbalance"], rel=1e-12)


def test_replicated_tables_cost_every_rank_their_whole_optimizer_step():
    """ddp steps every element of its replicated tables each step; freescale only the rows
    the batch touched, spread over the ranks. The cost lands on every rank alike: step
    time and busy time grow by it, the straggler share does not."""
    w = dataclasses.replace(small(64), item_vocab=1_000_000)
    per_element = dataclasses.replace(SLOW, table_ns_per_element=1.0)
    run = lambda trainer, cluster, n: simulate_run(  # noqa: E731
        RunConfig(workload=w, trainer=trainer, world_size=n), cluster, ".")[1]
    without, with_tables = run("ddp", SLOW, 2), run("ddp", per_element, 2)
    elements = (w.item_vocab + w.user_vocab + sum(w.context_vocabs)) * w.model.dim
    for a, b in zip(without, with_tables):
        assert b["step_time_ms"] - a["step_time_ms"] == pytest.approx(elements / 1e6, rel=1e-9)
        assert b["straggler_ms"] == pytest.approx(a["straggler_ms"], rel=1e-9)
    fs_without, fs_with = run("freescale", SLOW, 2), run("freescale", per_element, 2)
    extra = [b["step_time_ms"] - a["step_time_ms"] for a, b in zip(fs_without, fs_with)]
    assert 0 < max(extra) < elements / 1e6 / 20  # touched rows only, half each


# dist: a slope of wall times, bounded both ways (a burst on the large table's timing can
# floor it), judged on a try whose thread did not wait for a CPU (tests/support/timing.py).
@pytest.mark.dist
def test_calibrate_measures_the_optimizer_step_per_table_element():
    from fsbench.costmodel.timing import measure_table_ns_per_element

    w = get_workload("tiny")
    ns, quiet, waits = first_quiet_try(lambda: measure_table_ns_per_element(w, rows=(2_000, 40_000), repeats=3))
    assert ns >= 0
    if not quiet:
        judged_under_contention(f"CPU wait {', '.join(f'{x:.0%}' for x in waits)}; the last try measured "
                                f"{ns:.3g} ns per element, bounds not judged")
        return
    # A CPU's optimizer step touches a few floats per element: well above zero, well
    # under a microsecond per element on any machine this runs on.
    assert 0.01 < ns < 1000


# dist: a ratio of wall times of real processes (the pattern of the encoder-drift flake),
# judged on a try whose thread did not wait for a CPU.
@pytest.mark.dist
def test_corun_slowdown_is_measured_in_real_processes():
    from fsbench.costmodel.corun import measure_corun_slowdown

    (factor, processes), quiet, waits = first_quiet_try(
        lambda: measure_corun_slowdown(get_workload("tiny"), processes=2, repeats=3))
    assert processes == 2 and factor > 0
    if not quiet:
        judged_under_contention(f"CPU wait {', '.join(f'{x:.0%}' for x in waits)}; co-run factor "
                                f"{factor:.2f} not judged")
        return
    # Two processes computing at once on this host: not faster than one alone, and not
    # absurdly slower on a machine with 2+ cores.
    assert 0.7 < factor < 10


def test_the_corun_slowdown_applies_from_two_ranks_on_the_local_host_only():
    from types import SimpleNamespace

    costs = object.__new__(Costs)
    costs.cluster, costs.fit = CLUSTERS["local"], SimpleNamespace(corun_slowdown=1.4)
    assert [costs.corun_factor(n) for n in (1, 2, 16)] == [1.0, 1.4, 1.4]
    costs.cluster = H100  # a GPU per rank: nothing shared
    assert costs.corun_factor(16) == 1.0


def test_calibrate_measures_batch_terms():
    from fsbench.costmodel.calibrate import measure_batch_terms

    w = get_workload("tiny")
    # Against a per-sample model that says "free", the whole encoder time is residual: the
    # fit must then find a positive cost per batch (fixed or per bucket).
    terms = measure_batch_terms(w, lambda L: np.zeros(len(L)), batches=2, repeats=2)
    # against a model that says "free", no sample can cost less than nothing
    assert min(dataclasses.astuple(terms)) >= 0
    assert terms.batch_ms + terms.batch_sample_ms + terms.bucket_ms + terms.wide_ms_per_melem > 0


# dist: an upper bound on a wall time per element, judged on an uncontended try only.
@pytest.mark.dist
def test_calibrate_measures_a_replicas_table_work():
    from fsbench.costmodel.timing import measure_replicated_ns_per_element

    w = get_workload("tiny")
    # Wall time per element: its upper bound (a unit slip is 1e3-1e6 off) is judged only on
    # a try whose thread did not wait for a CPU; a neighbour cannot make it cheaper.
    ns, quiet, waits = first_quiet_try(lambda: measure_replicated_ns_per_element(w, repeats=2))
    assert ns > 0.01
    if quiet:
        assert ns < 1000
        return
    judged_under_contention(f"CPU wait {', '.join(f'{x:.0%}' for x in waits)} of each try; "
                            f"the last measured {ns:.0f} ns per element, upper bound not judged")


def test_cost_fit_squares_the_padded_length_as_the_model_does():
    """Costs planted as the model pays them (attention at the bucket's padded length) are
    fitted back exactly on calibrate's grid, and a fit says which square it holds: older
    fits (padded None) keep meaning a L^2 + b L + c."""
    from fsbench.costmodel.cost_curve import default_lengths, fit_quadratic, quadratic_cost
    from fsbench.models import Bucketing

    grid = default_lengths(200)
    P = Bucketing().padded_lengths(grid)
    planted = 1e-4 * P ** 2 + 0.01 * np.asarray(grid) + 0.02
    a, b, c, r2 = fit_quadratic(grid, planted)
    assert (a, b, c, r2) == pytest.approx((1e-4, 0.01, 0.02, 1.0), rel=1e-6)
    assert quadratic_cost(a, b, c, [200], padded=True)[0] == pytest.approx(1e-4 * 224 ** 2 + 2.02)
    assert quadratic_cost(a, b, c, [200], padded=False)[0] == pytest.approx(1e-4 * 200 ** 2 + 2.02)
    assert planted_fit(a=a, b=b, c=c).cost_ms(np.array([200]))[0] == pytest.approx(1e-4 * 200 ** 2 + 2.02)
    assert planted_fit(a=a, b=b, c=c, padded=True).cost_ms(np.array([200]))[0] == pytest.approx(
        1e-4 * 224 ** 2 + 2.02)


def test_batch_terms_recover_planted_fixed_bucket_wide_and_footprint_costs():
    """Residuals made from 2 ms a batch, -0.05 ms a sample (cost(L)'s constant too big),
    0.5 ms a bucket, 10 ms per million attention elements beyond a bucket of 16 samples
    of 200 (padded to 224) and 2% of cost(L) per thousand tokens beyond 2,048 are fitted
    back to those six numbers, on batches like calibrate's (jagged ones, long fixed
    lengths, many short samples)."""
    from fsbench.costmodel.batch_terms import (
        attention_melem, fit_batch_terms, footprint_excess, wide_excess)
    from fsbench.costmodel.batch_terms import bucket_count

    assert attention_melem([200] * 4 + [10]).tolist() == pytest.approx([4 * 224 ** 2 / 1e6, 16 ** 2 / 1e6])
    def cost(L):
        return 1e-4 * np.asarray(L, dtype=float) ** 2 + 0.01 * np.asarray(L, dtype=float)

    assert footprint_excess([100] * 20, cost) == 0.0  # 2,000 tokens: what cost(L) was timed on
    assert footprint_excess([100] * 30, cost) == pytest.approx(30 * 2.0 * 0.952)
    rng = np.random.default_rng(0)
    batches = [rng.integers(1, 200, int(rng.integers(1, 128))) for _ in range(12)]
    batches += [np.full(n, 200) for n in (8, 16, 32, 64, 128)]  # up to 6.4 million
    batches += [np.full(n, 8) for n in (16, 128)]
    threshold = 16 * 224 ** 2 / 1e6
    planted = [(L, 2.0 - 0.05 * len(L) + 0.5 * bucket_count(L) + 10.0 * wide_excess(L, threshold)
                + 0.02 * footprint_excess(L, cost)) for L in batches]
    assert dataclasses.astuple(fit_batch_terms(planted, cost)) == pytest.approx(
        (2.0, -0.05, 0.5, 10.0, threshold, 0.02), abs=1e-6)
    # nothing wide, no footprint: no slope, and the threshold says 0
    flat = [(L, 2.0 + 0.5 * bucket_count(L)) for L in batches]
    assert dataclasses.astuple(fit_batch_terms(flat, cost)) == pytest.approx((2.0, 0.0, 0.5, 0.0, 0.0, 0.0), abs=1e-9)
    # a footprint alone is not booked per sample (what the fit did before it had the term)
    grown = [(L, 0.02 * footprint_excess(L, cost)) for L in batches]
    assert dataclasses.astuple(fit_batch_terms(grown, cost)) == pytest.approx((0.0, 0.0, 0.0, 0.0, 0.0, 0.02), abs=1e-9)


class _Free:
    def seconds(self, n, nbytes):
        return 0.0

    def cpu_seconds(self, n, nbytes):
        return 0.0


def local_with(fit):
    """`Costs` of the local cluster with a given fit and free collectives."""
    class LocalCosts(Costs):
        def __init__(self, cluster, workload, store, timeshare_efficiency=None):
            self.cluster, self.workload, self.fit = cluster, workload, fit
            self._timeshare = timeshare_efficiency
            self.comm = {"all_reduce": _Free(), "all_to_all": _Free()}
    return LocalCosts


def planted_fit(**overrides):
    """A local fit with round numbers: 1 ms per token, 5 ms per batch, 0.5 ms per bucket,
    2 cores, free tables, and ddp's overhead of 4 ms wall (3 ms of it CPU, 1 ms busy) in
    both compute modes."""
    from fsbench.costmodel.fit import CostFit

    over = {"wall_ms": 4.0, "cpu_ms": 3.0, "busy_ms": 1.0, "input_ms": 0.0}
    return dataclasses.replace(CostFit(
        a=0.0, b=1.0, c=0.0, r2=1.0, model="m", device="d", lengths=[], per_sample_ms=[],
        table_ns_per_element=0.0, table_optimizer="adam", corun_slowdown=1.0, corun_processes=2,
        batch_ms=5.0, bucket_ms=0.5, replicated_ns_per_element=0.0,
        step_overhead={"ddp/model": over, "ddp/emulated": over}), **overrides)


def encoder_ms(source, step, n):
    """Each rank's encoder under the planted fit's costs (contiguous split)."""
    from fsbench.costmodel.batch_terms import bucket_count
    from fsbench.workloads.batch import contiguous_split

    L = source.global_batch(step).lengths.numpy()
    return np.array([L[idx].sum() + 5.0 + 0.5 * bucket_count(L[idx]) for idx in contiguous_split(len(L), n)])


def test_local_ranks_beyond_the_cores_time_share_unless_their_encoder_is_emulated(monkeypatch):
    from fsbench.scaling import simulate

    monkeypatch.setattr(simulate, "Costs", local_with(planted_fit()))
    w = small(64)
    source = SyntheticBatches(w, seed=0)
    # (compute, ranks, the encoder's wall per CPU ms, the overhead's wall): the overhead's
    # 3 ms of CPU time-share beyond 2 ranks, its 1 ms of waiting does not; an emulated
    # encoder waits without a core.
    for compute, n, share, overhead in (("model", 2, 1.0, 4.0), ("model", 4, 2.0, 7.0),
                                        ("emulated", 4, 1.0, 7.0)):
        _, rows = simulate_run(RunConfig(workload=dataclasses.replace(w, compute=compute), trainer="ddp",
                                         world_size=n), CLUSTERS["local"], ".")
        for row in rows:
            assert row["step_time_ms"] == pytest.approx(
                share * encoder_ms(source, row["step"], n).max() + overhead, rel=1e-9)


def test_beyond_the_cores_ranks_meet_the_measured_share_of_time_sharing(monkeypatch):
    """With ddp's measured efficiency of 0.5 (the trainers' mean is 0.9), 4 ranks on 2
    cores stretch its CPU work 1 + 0.5 x (4/2 - 1) = 1.5x, not 2x; at 2 ranks (no
    time-sharing) the efficiency changes nothing."""
    from fsbench.scaling import simulate

    monkeypatch.setattr(simulate, "Costs", local_with(planted_fit(
        timeshare={"efficiency": 0.9, "ranks": 4, "per_trainer": {"ddp": 0.5, "freescale": 1.3}})))
    w = small(64)
    source = SyntheticBatches(w, seed=0)
    for n, share in ((2, 1.0), (4, 1.5)):
        _, rows = simulate_run(RunConfig(workload=w, trainer="ddp", world_size=n), CLUSTERS["local"], ".")
        for row in rows:
            overhead = 3.0 * share + 1.0  # the overhead's CPU stretches, its wait does not
            assert row["step_time_ms"] == pytest.approx(
                share * encoder_ms(source, row["step"], n).max() + overhead, rel=1e-9)


def test_overheads_follow_the_global_batchs_tokens_between_their_two_measurements():
    """Measured at 6,400 tokens a global batch (8 ms, 6 of it CPU) and at 1,600 (2 ms, all
    CPU): 4,000 tokens pay halfway, 400 extrapolate down the line with the parts kept
    parts (CPU <= wall), none pay nothing, more than 6,400 pay what 6,400 did; a fit
    without the second measurement, or a caller that gives no tokens, gets the constant."""
    from fsbench.scaling.sim_costs import Costs

    full = {"wall_ms": 8.0, "cpu_ms": 6.0, "busy_ms": 1.0, "input_ms": 1.0, "worker_ms": 4.0, "tokens": 6400.0}
    quarter = {"wall_ms": 2.0, "cpu_ms": 2.0, "busy_ms": 0.0, "input_ms": 0.0, "worker_ms": 1.0, "tokens": 1600.0}
    costs = local_with(planted_fit(step_overhead={"ddp/model": full, "ddp/model@32": quarter}))(
        CLUSTERS["local"], small(64), ".")
    assert isinstance(costs, Costs)
    assert costs.step_overhead("ddp", "model", 4000.0) == pytest.approx(
        {"wall_ms": 5.0, "cpu_ms": 4.0, "busy_ms": 0.5, "input_ms": 0.5, "worker_ms": 2.5,
         "stage_ms": 0.0})
    low = costs.step_overhead("ddp", "model", 400.0)  # the line: wall 0.5, CPU 1.0 > wall
    assert low["wall_ms"] == pytest.approx(0.5) and low["cpu_ms"] == pytest.approx(0.5)
    assert low["busy_ms"] == 0.0 and costs.step_overhead("ddp", "model", 0.0)["wall_ms"] == 0.0
    assert costs.step_overhead("ddp", "model")["wall_ms"] == 8.0
    assert costs.step_overhead("ddp", "model", 64000.0)["wall_ms"] == 8.0  # not above what was measured
    alone = local_with(planted_fit(step_overhead={"ddp/model": full}))(CLUSTERS["local"], small(64), ".")
    assert alone.step_overhead("ddp", "model", 400.0)["wall_ms"] == 8.0


def test_expected_tokens_is_the_batch_times_its_clipped_mean_length():
    from fsbench.scaling.sim_costs import expected_tokens

    assert expected_tokens(dataclasses.replace(small(64), lengths="fixed:12")) == 64 * 12
    w = dataclasses.replace(small(64), lengths="uniform:10-30")
    assert expected_tokens(w) == pytest.approx(64 * 20, rel=0.01)
    assert expected_tokens(dataclasses.replace(w, global_batch_size=16)) == pytest.approx(expected_tokens(w) / 4)


def test_measuring_overheads_drops_the_efficiency_solved_against_the_old_ones(tmp_path, monkeypatch):
    from fsbench.costmodel.fit import fit_path, load_fit
    from fsbench.running.store import write_json_atomic
    from fsbench.scaling import step_overhead

    w = small(64)
    path = fit_path(tmp_path, w, "cpu")
    path.parent.mkdir(parents=True)
    held = planted_fit(timeshare={"efficiency": 0.5, "ranks": 8, "per_trainer": {"ddp": 0.5}})
    write_json_atomic(path, dataclasses.asdict(held))
    monkeypatch.setattr(step_overhead, "measure_step_overhead",
                        lambda *a, **k: {"wall_ms": 1.0, "cpu_ms": 1.0, "busy_ms": 0.0,
                                         "input_ms": 0.0, "worker_ms": 0.0})
    step_overhead.store_step_overheads(w, ["ddp"], tmp_path)  # lacks the tokens: measured anew
    fit = load_fit(tmp_path, w, "cpu")
    assert fit.timeshare is None and fit.step_overhead["ddp/model@16"]["tokens"] > 0


def test_encoder_drift_sets_the_real_encoder_now_against_the_fit(tmp_path, monkeypatch):
    """A fit that books half of another's reads twice its drift on the same encoder: the
    real encoder is timed on the run's batches and set against what the stored fit says
    (the overhead then leaves out what the fit under-books, and keeps the trainer's own
    work).

    The encoder is timed for real once, then the same timings are replayed against the
    second fit: two timings of a few ms each move by tens of percent with the machine
    (a ratio of 1.39 where 2 was planted failed `make test` on a quiet VM), while the
    arithmetic under test must give exactly the fits' ratio."""
    import torch

    from fsbench.costmodel import timing
    from fsbench.costmodel.fit import fit_path
    from fsbench.running.store import write_json_atomic
    from fsbench.scaling.step_overhead import encoder_drift

    torch.set_num_threads(1)
    w = dataclasses.replace(get_workload("tiny"), warmup=1)
    some = planted_fit(a=0.0, b=0.01, c=0.02, batch_ms=0.5, bucket_ms=0.1)
    half = dataclasses.replace(some, b=0.005, c=0.01, batch_ms=0.25, bucket_ms=0.05)
    timed: list[float] = []  # the first pass's real timings, in call order
    replay = iter(range(10**6))
    real_time_encoder_ms = timing.time_encoder_ms

    def time_once(*args, **kwargs):
        if len(timed) < 4:  # one call per batch (batches=4), timed for real
            timed.append(real_time_encoder_ms(*args, **kwargs))
            return timed[-1]
        return timed[next(replay)]  # the second fit sees the same timings

    monkeypatch.setattr(timing, "time_encoder_ms", time_once)
    ratios, drifts = [], []
    for held in (some, half):
        path = fit_path(tmp_path, w, "cpu")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, dataclasses.asdict(held))
        ms, ratio = encoder_drift(w, 0, tmp_path, batches=4)
        assert ratio > 0 and (ms > 0) == (ratio > 1)
        ratios.append(ratio)
        drifts.append(ms)
    assert ratios[1] / ratios[0] == pytest.approx(2.0, rel=1e-9)
    # ms per step = (timed - predicted) / batches, and the half fit predicts half as much
    predicted_ms = sum(timed) / 4 / ratios[0]
    assert drifts[1] - drifts[0] == pytest.approx(predicted_ms / 2, rel=1e-9)


def test_loader_workers_beyond_the_cores_preempt_by_the_measured_efficiency():
    from fsbench.scaling.simulate import worker_preemption_ms

    # 4 workers of 3 ms on 2 busy cores: 6 ms a core at full time-sharing, half at 0.5
    assert worker_preemption_ms(4, 2, 3.0, 10.0) == pytest.approx(6.0)
    assert worker_preemption_ms(4, 2, 3.0, 10.0, 0.5) == pytest.approx(3.0)
    # as many ranks as cores: no time-sharing, the efficiency does not apply
    assert worker_preemption_ms(2, 2, 3.0, 10.0, 0.5) == pytest.approx(3.0)


def test_solve_efficiency_meets_the_measured_step_and_clips_to_its_range():
    from fsbench.scaling.timeshare import solve_efficiency

    def simulated(e):
        return 100.0 + 50.0 * e

    assert solve_efficiency(simulated, 125.0) == pytest.approx(0.5, abs=1e-3)
    assert solve_efficiency(simulated, 90.0) == 0.0  # faster than no time-sharing at all
    assert solve_efficiency(simulated, 200.0) == 1.0  # slower than full time-sharing


def test_measure_timeshare_finds_the_efficiency_a_run_was_simulated_with(monkeypatch):
    """Round trip through the real simulator: "measured" 8-rank runs (4 x the planted 2
    cores) that took what the simulator gives at efficiency 0.3 calibrate back to 0.3."""
    from fsbench.costmodel import fit as fit_mod
    from fsbench.scaling import simulate, timeshare

    fit = planted_fit()
    fit.step_overhead["ddp/emulated"] = {"wall_ms": 4.0, "cpu_ms": 3.0, "busy_ms": 0.0,
                                         "input_ms": 0.0, "worker_ms": 2.0}
    monkeypatch.setattr(simulate, "Costs", local_with(fit))
    monkeypatch.setattr(fit_mod, "load_fit", lambda *a, **k: fit)
    run = RunConfig(workload=dataclasses.replace(small(64), compute="emulated"), trainer="ddp",
                    world_size=8)
    truth = simulate_run(run, CLUSTERS["local"], ".", timeshare_efficiency=0.3)[0]
    assert truth["step_time_ms_median"] > simulate_run(
        run, CLUSTERS["local"], ".", timeshare_efficiency=0.0)[0]["step_time_ms_median"]
    # ... and 16-rank runs (8 x the cores) that took what it gives at 0.6 calibrate to 0.6
    wide = dataclasses.replace(run, world_size=16)
    truths = {8: (run, truth), 16: (wide, simulate_run(wide, CLUSTERS["local"], ".", timeshare_efficiency=0.6)[0])}
    monkeypatch.setattr(timeshare, "calibration_run", lambda w, t, store, compute, steps, ranks:
                        (dataclasses.replace(truths[ranks][0], trainer=t), truths[ranks][1], None))
    found = timeshare.measure_timeshare(run.workload, ["ddp"], ".")
    assert found["ranks"] == 8 and found["efficiency"] == pytest.approx(0.3, abs=2e-3)
    assert found["wider"]["ranks"] == 16 and found["wider"]["efficiency"] == pytest.approx(0.6, abs=2e-3)


def test_the_efficiency_follows_the_ranks_per_core_between_its_two_measurements():
    """Measured at 8 ranks (0.4) and 16 (0.8) on 2 cores: up to 8 the first, the line
    between, beyond 16 the second; a fit measured at one rank count keeps it everywhere."""
    both = {"efficiency": 0.5, "ranks": 8, "per_trainer": {"ddp": 0.4},
            "wider": {"efficiency": 0.9, "ranks": 16, "per_trainer": {"ddp": 0.8}}}
    costs = local_with(planted_fit(timeshare=both))(CLUSTERS["local"], small(64), ".")
    assert [costs.timeshare_efficiency("ddp", n) for n in (4, 8, 12, 16, 32)] == pytest.approx(
        [0.4, 0.4, 0.6, 0.8, 0.8])
    assert costs.timeshare_efficiency("freescale", 12) == pytest.approx(0.7)  # the trainers' mean
    assert costs.time_sharing(12, "ddp") == pytest.approx(1 + 0.6 * 5)
    one = local_with(planted_fit(timeshare={k: v for k, v in both.items() if k != "wider"}))(
        CLUSTERS["local"], small(64), ".")
    assert one.timeshare_efficiency("ddp", 32) == 0.4


def test_local_causes_are_booked_as_the_metrics_book_a_measured_run(monkeypatch):
    """Run-queue waits (time-sharing) and CPU that is not busy are other idle, input waits
    input stall, an emulated run's real table work other idle, not busy; the causes sum
    to the bubble, and T - busy on every rank is the idle time."""
    from fsbench.scaling import simulate

    fit = planted_fit(replicated_ns_per_element=10.0, table_corun_slowdown=1.5)
    for key in fit.step_overhead:
        fit.step_overhead[key] = {"wall_ms": 4.0, "cpu_ms": 3.0, "busy_ms": 1.0, "input_ms": 0.5}
    monkeypatch.setattr(simulate, "Costs", local_with(fit))
    w = small(64)
    source = SyntheticBatches(w, seed=0)
    table_ms = (w.item_vocab + w.user_vocab + sum(w.context_vocabs)) * w.model.dim * 10.0 / 1e6
    for compute in ("model", "emulated"):
        summary, rows = simulate_run(RunConfig(workload=dataclasses.replace(w, compute=compute),
                                               trainer="ddp", world_size=4), CLUSTERS["local"], ".")
        for row in rows:
            parts = sum(row[f"{c}_ms"] for c in ("straggler", "exposed_comm", "input_stall", "other_idle"))
            assert parts == pytest.approx(row["idle_ms"], rel=1e-9)
            assert row["capacity_ms"] - row["idle_ms"] == pytest.approx(4 * row["busy_mean_ms"], rel=1e-9)
            # the loader worker's 0.5 ms takes turns on the cores as well (4 ranks, 2 cores)
            assert row["input_stall_ms"] == pytest.approx(4 * 2 * 0.5, rel=1e-9)
            # Each rank's own time beyond busy and input (4 ranks on 2 cores: CPU work takes
            # twice its CPU time): the encoder's turn (model) or none (emulated: a wait);
            # the overhead's 3 ms of CPU twice and its 0.5 ms off-CPU that is not input, less
            # 1 ms busy; the table work (x1.5 co-run) twice, busy once (model) or never.
            enc = encoder_ms(source, row["step"], 4)
            other = (enc if compute == "model" else 0 * enc) + 2 * 3.0 + 0.5 - 1.0 \
                + 1.5 * table_ms * (1 if compute == "model" else 2)
            # The straggler share comes out of communication waits first, then out of these.
            assert other.sum() - row["straggler_ms"] - 1e-6 <= row["other_idle_ms"] <= other.sum() + 1e-6
        assert summary["other_idle_ratio"] > 0 and summary["input_stall_ratio"] > 0


def test_communication_hides_under_the_encoder_not_under_the_overhead(monkeypatch):
    """A rank's overhead (input, Python, row gathering) comes before its forward: the row
    exchange can hide only under the encoder's time, however long the overhead."""
    from fsbench.scaling import simulate

    class AllToAll50(_Free):
        def seconds(self, n, nbytes):
            return 0.05

    fit = planted_fit(b=0.001, batch_ms=0.0, bucket_ms=0.0)
    for key in ("freescale/model", "freescale/emulated"):
        fit.step_overhead[key] = {"wall_ms": 200.0, "cpu_ms": 0.0, "busy_ms": 0.0, "input_ms": 0.0}
    costs = local_with(fit)

    class WithExchange(costs):
        def __init__(self, *args):
            super().__init__(*args)
            self.comm = {"all_reduce": _Free(), "all_to_all": AllToAll50()}
    monkeypatch.setattr(simulate, "Costs", WithExchange)
    w = small(64)
    source = SyntheticBatches(w, seed=0)
    _, rows = simulate_run(RunConfig(workload=w, trainer="freescale", world_size=2,
                                     trainer_options={"priority": "on", "balance": "off"}),
                           CLUSTERS["local"], ".")
    for row in rows:
        encoder = 0.001 * source.global_batch(row["step"]).lengths.numpy().sum()  # both ranks' at most
        # each rank waits at least 50 ms less its encoder for the rows (the straggler's
        # share aside)
        assert row["exposed_comm_ms"] >= 2 * (50.0 - encoder) - row["straggler_ms"] - 1e-6


def test_collectives_cpu_hidden_under_compute_preempts_the_ranks(monkeypatch):
    """gloo's threads carry a collective out on the cores the ranks compute on: on `local`,
    the part of its CPU that is hidden under the compute (FreeScale's next final rows, in
    the backward) lengthens a 2-rank step on 2 cores by exactly that CPU (no spare core
    takes it), booked per step as comm_cpu_ms; a comm fit without CPU points (from before
    they were measured) books none."""
    from fsbench.scaling import simulate

    class PerByte(_Free):  # 1 ns per byte
        def seconds(self, n, nbytes):
            return 1e-9 * nbytes

    class PerByteWithCpu(PerByte):
        def cpu_seconds(self, n, nbytes):
            return 0.8e-9 * nbytes

    def rows(comm):
        class WithComm(local_with(planted_fit())):
            def __init__(self, *args):
                super().__init__(*args)
                self.comm = {"all_reduce": comm, "all_to_all": comm}
        monkeypatch.setattr(simulate, "Costs", WithComm)
        return simulate_run(RunConfig(workload=small(64), trainer="freescale", world_size=2,
                                      trainer_options={"priority": "on", "balance": "off"}),
                            CLUSTERS["local"], ".", planner_time=False)[1][1:]  # steps with a step before

    without, with_cpu = rows(PerByte()), rows(PerByteWithCpu())
    for a, b in zip(without, with_cpu):
        assert a["comm_cpu_ms"] == 0.0
        # some of the step's collectives hide (their CPU is booked), not all of them
        assert 0.0 < b["comm_cpu_ms"] < 0.8 * b["link_ms"]
        assert b["step_time_ms"] == pytest.approx(a["step_time_ms"] + b["comm_cpu_ms"], rel=1e-9)
        assert b["other_idle_ms"] > a["other_idle_ms"]


def test_comm_fit_keeps_a_line_per_measured_world_size():
    """On a host with fewer cores than ranks latency and per-byte cost grow with N in ways
    one model over N misses: each measured N keeps its own line, sizes between two
    measured N interpolate, beyond them the model over all N answers."""
    lines = {2: (1e-3, 1e-9), 8: (30e-3, 4e-9)}
    points = [(n, b, a + beta * b) for n, (a, beta) in lines.items() for b in (4096, 1 << 20, 8 << 20)]
    f = fit_comm("all_reduce", points)
    for n, (a, beta) in lines.items():
        assert f.seconds(n, 32 << 20) == pytest.approx(a + beta * (32 << 20), rel=1e-6)
    at4 = (2 / 3) * f.seconds(2, 1 << 20) + (1 / 3) * f.seconds(8, 1 << 20)
    assert f.seconds(4, 1 << 20) == pytest.approx(at4, rel=1e-9)
    assert f.seconds(16, 1 << 20) == f.model_seconds(16, 1 << 20)


def test_simulate_command_stores_labelled_runs(tmp_path, capsys):
    out = tmp_path / "sim"
    assert main(["simulate", "--workload", "small", "--trainers", "ddp,freescale",
                 "--world-sizes", "8,16", "--steps", "4", "--warmup", "1", "--set", "batch_per_rank=16",
                 "--sim-store", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("SIMULATED")
    runs = load_runs(out)
    assert len(runs) == 4 and runs["simulated"].all()
    assert sorted(runs["world_size"].unique()) == [8, 16]
    manifest = json.loads(open(f"{runs['run_dir'].iloc[0]}/manifest.json").read())
    assert manifest["simulated"] is True and manifest["cluster"]["name"] == "h100"


def test_local_cluster_without_calibration_is_refused_in_one_line(tmp_path, capsys):
    assert main(["simulate", "--cluster", "local", "--store", str(tmp_path), "--world-sizes", "2",
                 "--sim-store", str(tmp_path / "sim")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fsbench calibrate" in err[0]


@pytest.mark.dist
def test_calibrate_comm_measures_real_gloo_collectives(tmp_path):
    from fsbench.scaling.commcal import calibrate_comm, load_comm_fits

    # sizes 16384x apart, median of 5: a 4 KiB collective costs a wake-up or two, which on
    # a busy 2-core machine can reach several ms, as much as a few MiB (8 MiB lost to it
    # once beside a spinning neighbour); 64 MiB takes tens of ms and cannot be that fast
    fits = calibrate_comm(tmp_path, [2], sizes=(4096, 64 << 20), repeats=5)
    assert set(fits) == {"all_reduce", "all_to_all"}
    stored = load_comm_fits(tmp_path)
    for name, f in stored.items():
        assert len(f.points) == 2 and all(p[2] > 0 for p in f.points)
        # 64 megabytes take longer than four kilobytes on any real link
        assert f.seconds(2, 64 << 20) > f.seconds(2, 4096)
        # gloo's threads sum and copy 64 MiB: CPU a rank's other threads spend
        assert len(f.cpu_points) == 2 and f.cpu_seconds(2, 64 << 20) > 0


def test_calibrate_overhead_of_an_unknown_trainer_is_refused_before_calibrating(tmp_path, capsys):
    assert main(["calibrate", "--workload", "tiny", "--overhead", "ddp,nope", "--store", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope" in err[0] and "ddp" in err[0]
    assert not (tmp_path / "calibrations").exists()  # nothing was measured first


def _planted_times(batch_ms: float = 2.0, sample_ms: float = 0.1, noise=()):
    """Encoder timings of a planted encoder (cost(L) = 0.01 L^2 + 0.2 L + 0.05 ms a sample;
    a batch pays `batch_ms` and `sample_ms` a sample beyond it), on lengths and batches like
    a calibration's; `noise`: (batch index, factor) pairs that slow those batches."""
    from fsbench.costmodel.calibrate import EncoderTimes
    from fsbench.costmodel.cost_curve import quadratic_cost

    lengths = [8, 16, 32, 64, 128]
    per_sample = [float(quadratic_cost(0.01, 0.2, 0.05, np.array([L]), True)[0]) for L in lengths]
    rng = np.random.default_rng(0)
    shapes = [rng.integers(1, 129, n) for n in (160, 80, 40, 20, 10)] + [np.full(n, 8) for n in (20, 160)] \
        + [np.full(n, 128) for n in (16, 32, 64)]
    batches = [(L, float(quadratic_cost(0.01, 0.2, 0.05, L, True).sum()) + batch_ms + sample_ms * len(L))
               for L in shapes]
    for i, factor in noise:
        batches[i] = (batches[i][0], batches[i][1] * factor)
    return EncoderTimes(lengths, per_sample, batches)


def test_calibrating_in_passes_fits_the_passes_median_timings(tmp_path, monkeypatch):
    """Three passes: one encoder model fitted to each length's and each batch's median
    timing, so a batch that one pass timed slow moves nothing; each separately measured
    figure's own median (here from different passes); every pass recorded; the file
    stored. (Before: the whole model of the median pass, its batch terms fitted to that
    pass's noise.)"""
    from fsbench.costmodel import calibrate as cal
    from fsbench.costmodel.fit import load_fit
    from fsbench.workloads.presets import get_workload

    w = get_workload("tiny")
    clean = cal.encoder_model(_planted_times())
    assert clean["batch_sample_ms"] == pytest.approx(0.1, abs=1e-6)
    assert clean["batch_ms"] == pytest.approx(2.0, abs=1e-6)
    times = [_planted_times(noise=[(0, 1.4), (6, 3.0)]), _planted_times(), _planted_times(noise=[(5, 2.0)])]
    # One pass alone is off where its noise sits: it would have been kept whole before.
    assert abs(cal.encoder_model(times[0])["batch_sample_ms"] - 0.1) > 0.01
    fits = [planted_fit(corun_slowdown=0.9, table_corun_slowdown=1.3),
            planted_fit(corun_slowdown=1.3, table_corun_slowdown=1.0),
            planted_fit(corun_slowdown=1.1, table_corun_slowdown=1.1, table_ns_per_element=2.0)]
    runs = list(zip(fits, times))
    monkeypatch.setattr(cal, "measure_pass", lambda *a, **k: runs.pop(0))
    fit = cal.calibrate(w, tmp_path, passes=3)
    for name in ("a", "b", "c", "batch_ms", "batch_sample_ms", "bucket_ms"):
        assert getattr(fit, name) == pytest.approx(clean[name], abs=1e-9), name
    assert (fit.corun_slowdown, fit.table_corun_slowdown, fit.table_ns_per_element) == (1.1, 1.1, 0.0)
    assert [p["encoder_batch_ms"] for p in fit.passes] == pytest.approx([cal.encoder_batch_ms(f, w) for f in fits])
    assert [p["corun_slowdown"] for p in fit.passes] == [0.9, 1.3, 1.1]
    assert load_fit(tmp_path, w) == fit


def test_calibrate_refuses_no_passes(tmp_path, capsys):
    assert main(["calibrate", "--workload", "tiny", "--passes", "0", "--store", str(tmp_path)]) == 2
    assert "--passes=0 must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "calibrations").exists()


@pytest.mark.dist
def test_calibrate_measures_each_trainers_overhead_and_the_simulator_adds_it(tmp_path, capsys,
                                                                          no_corun_measurement):
    """`fsbench calibrate --overhead ddp` runs real 1-rank runs in both compute modes, at
    the batch and a quarter of it, and stores what they cost beyond the model; a 1-rank
    simulation of the calibrated batch then takes exactly the stored wall overhead more
    per step (one rank: no co-run, no time-sharing)."""
    import torch

    from fsbench.costmodel.fit import load_fit
    from fsbench.workloads.presets import get_workload

    threads = torch.get_num_threads()
    try:
        assert main(["calibrate", "--workload", "tiny", "--overhead", "ddp", "--passes", "1",
                     "--store", str(tmp_path)]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "| ddp/model " in out and "| ddp/emulated " in out
    w = get_workload("tiny")
    torch.set_num_threads(1)  # the fit's key holds the ranks' thread count
    try:
        fit = load_fit(tmp_path, w)
        quarter = w.global_batch_size // 4  # each is measured at the batch and a quarter of it
        assert set(fit.step_overhead) == {"ddp/model", "ddp/emulated",
                                          f"ddp/model@{quarter}", f"ddp/emulated@{quarter}"}
        assert fit.step_overhead[f"ddp/model@{quarter}"]["tokens"] == pytest.approx(
            fit.step_overhead["ddp/model"]["tokens"] / 4)
        for parts in fit.step_overhead.values():
            assert 0 <= parts["busy_ms"] <= parts["cpu_ms"] <= parts["wall_ms"]
            assert parts["cpu_ms"] + parts["input_ms"] <= parts["wall_ms"] + 1e-9
        run = RunConfig(workload=dataclasses.replace(w, steps=6, warmup=1), trainer="ddp", world_size=1)
        _, with_ = simulate_run(run, CLUSTERS["local"], tmp_path)
        _, without = simulate_run(run, CLUSTERS["local"], tmp_path, step_overhead=False)
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(without, with_):
        assert b["step_time_ms"] - a["step_time_ms"] == pytest.approx(
            fit.step_overhead["ddp/model"]["wall_ms"], rel=1e-9, abs=1e-9)


def real_ddp_buckets(tmp_path, module, loss, bucket_cap_mb: float = 25.0) -> list[int]:
    """Bytes of each all-reduce call real DDP makes for `module` on a gloo group of one
    (a comm hook records them), at its third step: the first is DDP's own warm-up (one
    25 MiB pass) before it rebuilds its buckets in the order gradients arrived."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    seen = []

    def record(state, bucket):
        seen.append(bucket.buffer().numel() * 4)
        done = torch.futures.Future()
        done.set_result(bucket.buffer())
        return done

    tmp_path.mkdir(exist_ok=True)
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        ddp = DistributedDataParallel(module, bucket_cap_mb=bucket_cap_mb)
        ddp.register_comm_hook(None, record)
        for _ in range(3):
            seen.clear()
            loss(ddp).backward()
    finally:
        dist.destroy_process_group()
    return seen


def test_ddp_buckets_are_the_buckets_real_ddp_makes(tmp_path):
    """The simulator's all-reduce calls are the ones PyTorch DDP makes once it has rebuilt
    its buckets, at the cap every trainer gives it (the workload's dense_bucket_mb): in
    the order gradients arrive, a large parameter alone."""
    import torch

    from fsbench.scaling.ddp_buckets import ddp_buckets

    class Params(torch.nn.Module):
        def forward(self):
            return sum(p.sum() for p in self.parameters())

    sizes = [30 << 18, 3 << 18, 2 << 17, 1 << 17, 5 << 16]  # elements (4 bytes each)
    module = Params()
    for i, numel in enumerate(sizes):
        module.register_parameter(f"p{i}", torch.nn.Parameter(torch.ones(numel)))
    # this module's gradients are ready in reverse registration order
    for mb, buckets in ((25.0, 1), (2.0, 3), (1.0, 4)):
        seen = real_ddp_buckets(tmp_path / str(mb), module, lambda ddp: ddp(), bucket_cap_mb=mb)
        assert [int(b) for b in ddp_buckets([4.0 * n for n in reversed(sizes)], mb * 2**20)] == seen
        assert len(seen) == buckets


@pytest.mark.parametrize("preset,compute", [("tiny", "model"), ("comm-heavy", "model"),
                                            ("comm-heavy", "emulated")])
def test_ddp_buckets_of_a_real_encoder_follow_its_gradients_order(tmp_path, preset, compute):
    """On the real encoder, whose gradients are not ready in reverse registration order,
    the simulator's calls are still DDP's own, and under the emulation's wait, which
    hands back every gradient at once in its own order (comm-heavy's 1.2 MB: one call
    with the model, two emulated)."""
    import torch

    from fsbench.costmodel.timing import encoder_inputs
    from fsbench.scaling.ddp_buckets import ddp_buckets, dense_grad_bytes
    from fsbench.models.emulation import waiting_loss
    from fsbench.models import build_model

    w = dataclasses.replace(get_workload(preset), global_batch_size=4, compute=compute)
    vocab = max(2048, 4 * w.num_negatives)  # tables shrunk (not the encoder), other draws
    shrunk = dataclasses.replace(w, item_vocab=vocab, user_vocab=vocab,
                                 context_vocabs=tuple(vocab for _ in w.context_vocabs))
    model = build_model(shrunk, seed=0)
    batch = SyntheticBatches(shrunk, seed=1).global_batch(0)

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.dense = model.dense

        def forward(self, lookups):
            if compute == "emulated":
                return waiting_loss(0.0, self.dense, lookups)
            return self.dense(lookups, batch)

    seen = real_ddp_buckets(tmp_path, Encoder(), lambda ddp: ddp(encoder_inputs(model, batch)))
    assert [int(b) for b in ddp_buckets(list(dense_grad_bytes(w)))] == seen


# --- assumptions travel with the numbers -------------------------------------------------

def test_every_simulated_output_names_the_clusters_assumed_figures(tmp_path, capsys, monkeypatch):
    """summary.json, the store's index, the command's text and JSON, and every report
    format (the notes, the CSV's column, the PNGs' header) say which figures are assumed."""
    from fsbench.reporting.plots import render_plots
    from fsbench.reporting.report import render, report_table

    out = tmp_path / "sim"
    args = ["simulate", "--workload", "small", "--trainers", "ddp,freescale", "--world-sizes", "8",
            "--steps", "3", "--warmup", "1", "--set", "batch_per_rank=8", "--sim-store", str(out)]
    assert main(args) == 0
    text = capsys.readouterr().out
    # the collectives are fitted on published nccl-tests results: measured, not assumed
    assert "h100 (preset): ASSUMED peak_tflops=989 TFLOPS" in text
    assert "measured gpus_per_node=8, intra_gbs=" in text
    runs = load_runs(out)
    assert runs["assumptions"].str.contains("ASSUMED .*sm_slowdown=0.1", regex=True).all()
    summary = json.loads((Path(runs["run_dir"].iloc[0]) / "summary.json").read_text())
    assert summary["assumptions"] == runs["assumptions"].iloc[0]
    assert main([*args, "--format", "json"]) == 0
    record = json.loads(capsys.readouterr().out)["assumptions"]
    assert record["assumed"] == ["peak_tflops", "mfu", "layer_overhead_ms", "sm_slowdown", "host_sync_s",
                                 "table_ns_per_element", "input_workers", "host_cpu_speed"]
    assert record["figures"]["inter_gbs"] == CLUSTERS["h100"].inter_gbs
    table = report_table(runs, "ddp")
    for fmt, figure in (("md", "ASSUMED peak_tflops=989 TFLOPS"), ("html", "ASSUMED peak_tflops=989 TFLOPS"),
                        ("latex", r"ASSUMED peak\_tflops=989 TFLOPS")):
        assert figure in render(table, fmt), fmt
    assert "ASSUMED" in render(table, "csv").splitlines()[1]
    from matplotlib.figure import Figure

    titles, real_savefig = [], Figure.savefig

    def recording(fig, *a, **k):  # the header each PNG is drawn with
        titles.append(fig.get_suptitle())
        return real_savefig(fig, *a, **k)
    monkeypatch.setattr(Figure, "savefig", recording)
    render_plots(table, runs, "ddp")
    assert len(titles) == 4 and all("SIMULATED points: h100" in t and "ASSUMED" in t for t in titles)


def test_a_cluster_file_and_cluster_set_are_loaded_and_named(tmp_path, capsys):
    from fsbench.scaling.sim_inputs import FIGURES, assumptions, load_cluster

    path = tmp_path / "b200.toml"
    path.write_text('name = "b200"\ndescription = "8x B200"\ngpus_per_node = 8\nintra_gbs = 900\n'
                    'inter_gbs = 100\nalpha_s = 8e-6\npeak_tflops = 2250\nmfu = 0.2\n'
                    'measured = ["intra_gbs"]\n')
    cluster = load_cluster(str(path), ["inter_gbs=50"])
    assert (cluster.name, cluster.intra_gbs, cluster.inter_gbs, cluster.gpus_per_node) == ("b200", 900, 50, 8)
    assert "intra_gbs" not in cluster.assumed and "inter_gbs" in cluster.assumed
    assert set(cluster.assumed) == set(FIGURES) - {"intra_gbs"}  # unset figures are assumed too
    line = assumptions(cluster)
    assert "--cluster-set inter_gbs" in line and "measured intra_gbs=900 GB/s" in line
    assert main(["simulate", "--cluster", str(path), "--cluster-set", "mfu=0.4", "--workload", "small",
                 "--world-sizes", "16", "--steps", "3", "--warmup", "1", "--set", "batch_per_rank=8",
                 "--sim-store", str(tmp_path / "sim")]) == 0
    assert "b200" in capsys.readouterr().out
    assert load_runs(tmp_path / "sim")["assumptions"].str.contains("mfu=0.4").all()


def gpu_fit_file(tmp_path, workload, **overrides) -> Path:
    """A fit as `fsbench calibrate --device cuda` stores it, for `workload`'s model (planted
    figures: this machine has no GPU to measure)."""
    from fsbench.costmodel.fit import model_key

    path = tmp_path / "gpu_fit.json"
    fit = planted_fit(**{"model": model_key(workload), "device": "nvidia-h100-80gb-hbm3",
                         "table_optimizer": workload.optimizer, **overrides})
    path.write_text(json.dumps(dataclasses.asdict(fit)))
    return path


def test_a_measured_encoder_fit_replaces_the_gpu_clusters_compute_figures(tmp_path, capsys):
    """`--cluster-fit`: the fit's cost per token, per batch and per bucket is booked in
    place of FLOPs at mfu x peak and the launches (a 1-rank ddp step on h100 is then the
    fit's encoder time plus its table work), and those figures leave the assumptions in
    every output; the links stay assumed."""
    from fsbench.scaling.sim_inputs import FIT_REPLACES, assumption_record, assumptions, load_cluster

    w = dataclasses.replace(small(64), steps=4, warmup=1)
    path = gpu_fit_file(tmp_path, w, table_ns_per_element=2.0, replicated_ns_per_element=3.0)
    cluster = load_cluster("h100", [], str(path))
    assert cluster.replaced == (*FIT_REPLACES, "table_ns_per_element")
    assert set(cluster.assumed) == {"sm_slowdown", "host_sync_s", "input_workers", "host_cpu_speed"}
    line = assumptions(cluster)
    assert f"encoder measured: the fit {path}" in line and "mfu=" not in line
    assert assumption_record(cluster)["replaced_by_fit"] == [*FIT_REPLACES, "table_ns_per_element"]
    source = SyntheticBatches(w, seed=0)
    elements = sum(w.model.dim * v for v in (w.item_vocab, w.user_vocab, *w.context_vocabs))
    _, rows = simulate_run(RunConfig(workload=w, trainer="ddp", world_size=1), cluster, tmp_path)
    for row in rows:
        assert row["step_time_ms"] == pytest.approx(
            encoder_ms(source, row["step"], 1)[0] + elements * 2.0 / 1e6, rel=1e-9)
    _, flops = simulate_run(RunConfig(workload=w, trainer="ddp", world_size=1), CLUSTERS["h100"], tmp_path)
    assert flops[0]["step_time_ms"] < rows[0]["step_time_ms"] / 10  # the planted fit is slow
    assert main(["simulate", "--cluster", "h100", "--cluster-fit", str(path), "--workload", "small",
                 "--world-sizes", "8", "--steps", "3", "--warmup", "1", "--set", "batch_per_rank=8",
                 "--sim-store", str(tmp_path / "sim")]) == 0
    assert "encoder measured: the fit" in capsys.readouterr().out
    assert load_runs(tmp_path / "sim")["assumptions"].str.contains("in place of peak_tflops").all()


def test_freescale_plans_with_the_clusters_encoder_fit():
    """On a GPU cluster with a measured encoder (quadratic here, unlike `medium`'s mostly
    linear FLOPs), FreeScale plans with the fit as the trainer would find it there: its
    residual straggler is a hundredth of planning with FLOPs (freescale.cost=analytical)."""
    import tempfile

    from fsbench.scaling.sim_inputs import load_cluster

    w = dataclasses.replace(get_workload("medium"), global_batch_size=256, steps=8, warmup=1)
    with tempfile.TemporaryDirectory() as tmp:
        cluster = load_cluster("h100", [], str(gpu_fit_file(Path(tmp), w, a=0.01, b=0.0, batch_ms=0.0,
                                                                bucket_ms=0.0)))

        def straggler(cost):
            summary, _ = simulate_run(RunConfig(workload=w, trainer="freescale", world_size=4,
                                                trainer_options={"tables": "replicated", "cost": cost}),
                                      cluster, tmp)
            return summary["straggler_bubble_ratio"]

        off, fitted = straggler("analytical"), straggler("auto")
    assert off > 0.005 and fitted < off / 100, (off, fitted)


def test_a_cluster_file_names_its_encoder_fit_beside_it(tmp_path):
    from fsbench.scaling.sim_inputs import load_cluster

    gpu_fit_file(tmp_path, small(64))
    (tmp_path / "h100x.toml").write_text('name = "h100x"\nencoder_fit = "gpu_fit.json"\nintra_gbs = 370\n')
    cluster = load_cluster(str(tmp_path / "h100x.toml"))
    assert cluster.encoder_fit == str(tmp_path / "gpu_fit.json") and "mfu" not in cluster.assumed
    assert cluster.source == str(tmp_path / "h100x.toml")
    from fsbench.errors import ConfigError

    (tmp_path / "bad.toml").write_text('name = "bad"\nencoder_fit = "missing.json"\n')
    with pytest.raises(ConfigError, match=r"--cluster .*bad.toml: encoder_fit .*missing.json: cannot read it"):
        load_cluster(str(tmp_path / "bad.toml"))


@pytest.mark.parametrize("fit, argv, expected", [
    ({}, ["--workload", "large"], "not of this workload's model hstu-d"),
    ({}, ["--cluster", "local"], "takes every cost from this machine's fits already"),
    ({"table_optimizer": "sgd", "table_ns_per_element": 1.0}, [], "its table cost is sgd's"),
    (None, [], "--cluster-fit "),
])
def test_a_wrong_encoder_fit_is_refused_in_one_line(tmp_path, capsys, fit, argv, expected):
    from fsbench.workloads.presets import get_workload as preset

    path = gpu_fit_file(tmp_path, preset("small"), **fit) if fit is not None else tmp_path / "none.json"
    assert main(["simulate", "--workload", "small", "--world-sizes", "8", "--cluster-fit", str(path),
                 "--sim-store", str(tmp_path / "sim"), "--store", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err


@pytest.mark.parametrize("argv, expected", [
    (["--cluster", "a100"], "not a preset (h100, local) nor a .toml or .json cluster file"),
    (["--cluster-set", "nvlink=900"], "FIGURE one of: gpus_per_node"),
    (["--cluster-set", "mfu=1.5"], "mfu='1.5' must be in (0, 1]"),
    (["--cluster-set", "intra_gbs=fast"], "intra_gbs='fast' is not a number"),
    (["--cluster", "local", "--cluster-set", "mfu=0.3"], "takes its costs from this machine's fits"),
])
def test_bad_clusters_are_refused_in_one_line(tmp_path, capsys, argv, expected):
    assert main(["simulate", "--world-sizes", "8", "--sim-store", str(tmp_path / "sim"),
                 "--store", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err


def test_a_cluster_file_with_an_unknown_key_names_the_allowed_ones(tmp_path):
    from fsbench.errors import ConfigError
    from fsbench.scaling.sim_inputs import load_cluster

    path = tmp_path / "c.json"
    path.write_text(json.dumps({"name": "c", "nvlink_gbs": 900}))
    with pytest.raises(ConfigError, match=r"unknown keys \['nvlink_gbs'\]; allowed: .*intra_gbs"):
        load_cluster(str(path))


def test_sensitivity_takes_each_assumed_figure_at_half_and_twice(tmp_path, capsys):
    """Every figure h100 assumes, at x0.5, x1 and x2: x1 is the plain projection's
    reduction (freescale's bubble against ddp's) whatever the figure. Without the
    planner's time: timed on this CPU in each command, it made the two differ on a busy
    machine."""
    common = ["--workload", "small", "--trainers", "ddp,freescale", "--world-sizes", "16",
              "--steps", "3", "--warmup", "1", "--set", "batch_per_rank=8", "--format", "json",
              "--planner-time", "off"]
    assert main(["simulate", "--sensitivity", *common]) == 0
    rows = json.loads(capsys.readouterr().out)["sensitivity"]
    assert [r["figure"] for r in rows] == list(H100.assumed)  # the collectives are measured
    assert main(["simulate", *common, "--sim-store", str(tmp_path)]) == 0
    bubble = {r["trainer"]: r["bubble_ratio"] for r in json.loads(capsys.readouterr().out)["table"]}
    plain = 1 - bubble["freescale"] / bubble["ddp"]
    assert all(r["reduction_x1"] == pytest.approx(plain, rel=1e-12) for r in rows)
    assert any(r["swing"] > 0.01 for r in rows)  # some figure moves the headline
    assert all(r["swing"] == max(r[f"reduction_x{k}"] for k in ("0.5", "1", "2"))
               - min(r[f"reduction_x{k}"] for k in ("0.5", "1", "2")) for r in rows)


def test_sensitivity_charges_every_variant_the_planning_time_timed_at_x1(monkeypatch):
    """The planner's time is timed once per run, at x1, and charged alike at x0.5 and x2:
    a planner clock that reads 5 ms a plan for the first (x1) run and 0 after (a busy
    moment, say) stalls every variant as it stalled x1, so the swing does not come from
    this CPU (each variant used to time its own)."""
    import types

    from freescale_impl import routing_cost, trainer as fs_trainer
    from fsbench.scaling.sensitivity import reduction, sensitivity, varied

    reads = []

    def thread_time_ns():  # two reads a plan; the first run plans 4 times (a warm-up + 3)
        reads.append(1)
        return (5_000_000 if len(reads) <= 8 else 0) * (len(reads) // 2)
    monkeypatch.setattr(fs_trainer, "time", types.SimpleNamespace(thread_time_ns=thread_time_ns))
    routes = []

    def stage_times(*args):  # the routing likewise: 3 ms (and 1 ms of prep) at x1's run, 0 after
        routes.append(1)
        return routing_cost.StageTimes(*((3.0, 1.0) if len(routes) == 1 else (0.0, 0.0)))
    monkeypatch.setattr(routing_cost, "stage_times", stage_times)
    w = dataclasses.replace(get_workload("small"), steps=3, warmup=1)
    rows = sensitivity(H100, w, [("ddp", {}), ("freescale", {})], [16], 8, ".")
    run = lambda t, ww: RunConfig(workload=ww, trainer=t, world_size=16)  # noqa: E731
    scaled = dataclasses.replace(w, global_batch_size=16 * 8)
    for r in rows:
        for k in (0.5, 2.0):
            c = varied(H100, r["figure"], k)
            expected = reduction(*(simulate_run(run(t, scaled), c, ".", planner_ms=ms, route_ms=r, prep_ms=p)[0]
                                   for t, ms, r, p in (("ddp", 0.0, 0.0, 0.0), ("freescale", 5.0, 3.0, 1.0))))
            assert r[f"reduction_x{k:g}"] == pytest.approx(expected, rel=1e-9), (r["figure"], k)
    unstalled = simulate_run(run("freescale", scaled), H100, ".", planner_time=False)[0]
    assert simulate_run(run("freescale", scaled), H100, ".", planner_ms=5.0, route_ms=0.0)[0]["step_time_ms_median"] \
        > unstalled["step_time_ms_median"]  # the 5 ms do stall the step


def test_halving_the_network_slows_ddp_across_nodes():
    """The figures reach the model: ddp's step at 16 GPUs (2 nodes) takes longer as the
    inter-node bandwidth halves, and no longer as it doubles (8 NICs at twice the speed
    outrun NVLink, which then bounds the all-reduce: fsbench.scaling.collectives)."""
    from fsbench.scaling.sensitivity import varied
    from fsbench.scaling.simulate import scaled_workload
    from fsbench.workloads.presets import get_workload

    w = scaled_workload(dataclasses.replace(get_workload("small"), steps=3, warmup=1), 16, "weak", 8)
    run = RunConfig(workload=w, trainer="ddp", world_size=16)
    t = [simulate_run(run, varied(CLUSTERS["h100"], "inter_gbs", k), "unused")[0]["step_time_ms_median"]
         for k in (0.5, 1.0, 2.0)]
    assert t[0] > t[1] >= t[2], t


@pytest.mark.parametrize("argv, expected", [
    (["--trainers", "ddp"], "--sensitivity compares two trainers"),
])
def test_sensitivity_bad_input_is_one_line(tmp_path, capsys, argv, expected):
    assert main(["simulate", "--sensitivity", "--world-sizes", "8", "--store", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err


def test_fresh_rows_are_the_rows_drawn_again_after_an_update():
    from fsbench.scaling.sim_costs import expected_distinct, expected_fresh

    draws = np.array([10.0, 1_000.0, 100_000.0])
    distinct = expected_distinct(draws, 50_000, 1.05)
    assert np.all(expected_fresh(draws, 50_000, 1.05, 0.0) == 0)  # nothing was updated
    assert np.allclose(expected_fresh(draws, 50_000, 1.05, 1e12), distinct)  # everything was
    some = expected_fresh(draws, 50_000, 1.05, 5_000.0)
    assert np.all(some > 0) and np.all(some < distinct)
    # Popular items come back: more of a batch is fresh under a steeper popularity.
    assert np.all(expected_fresh(draws, 50_000, 1.4, 5_000.0) / expected_distinct(draws, 50_000, 1.4)
                  > some / distinct)


def _exchange_runs(w, n=8):
    def run(priority):
        return RunConfig(workload=w, trainer="freescale", world_size=n,
                         trainer_options={"tables": "sharded", "overlap": "on", "priority": priority})
    # the exchange alone: the planner's time on this CPU is no part of it
    return [simulate_run(run(p), H100, ".", planner_time=False)[0] for p in ("off", "on")]


def test_prioritizing_cannot_send_rows_before_the_step_that_updates_them():
    """Rows the current step updates can only leave after its update: where every row a
    step reads was updated by the step before (a tiny catalogue), sending the next step's
    rows early hides nothing, and the prioritized exchange costs what the overlapped one
    does (today's simulator hid them all). With a large catalogue of nearly even popularity
    few rows come back, and prioritizing still hides the forward exchange's first chunk,
    which the overlapped exchange must wait for."""
    medium = get_workload("medium")
    tiny_catalogue = dataclasses.replace(medium, item_vocab=200, user_vocab=50,
                                         context_vocabs=(5,), steps=6, warmup=1,
                                         global_batch_size=8 * 128)
    overlapped, prioritized = _exchange_runs(tiny_catalogue)
    assert prioritized["exposed_comm_ratio"] == pytest.approx(overlapped["exposed_comm_ratio"], rel=0.02)
    assert prioritized["step_time_ms_median"] == pytest.approx(overlapped["step_time_ms_median"], rel=0.02)
    # 512 a GPU: at 128 the overlapped exchange's first chunk arrives within the host sync
    # at the step's start (its flight overlaps the sync's idle), leaving nothing to hide.
    large_catalogue = dataclasses.replace(tiny_catalogue, item_vocab=10_000_000, user_vocab=10_000_000,
                                          context_vocabs=(1_000_000,), popularity="zipf:0.3",
                                          global_batch_size=8 * 512)
    overlapped, prioritized = _exchange_runs(large_catalogue)
    assert prioritized["exposed_comm_ratio"] < overlapped["exposed_comm_ratio"] - 0.002


def test_collectives_in_flight_together_share_the_links():
    """A step holds every transfer it makes: with the links shared, the step takes at
    least their sum, however much of each one alone would hide under compute (the
    simulator used to hide the gradients' all-reduce and all-to-all under the same
    backward side by side, each at full bandwidth). Checked where communication is
    light and where it outgrows the compute (slower networks)."""
    w = dataclasses.replace(get_workload("medium"), steps=4, warmup=1, global_batch_size=64 * 32)
    exchanges = {"ddp": ("ddp", {})}
    for name, overlap, priority in (("blocking", "off", "off"), ("overlapped", "on", "off"),
                                    ("prioritized", "on", "on")):
        exchanges[name] = ("freescale", {"tables": "sharded", "overlap": overlap, "priority": priority})
    overflowed = set()
    for inter_gbs in (50.0, 5.0, 0.5):
        cluster = dataclasses.replace(H100, inter_gbs=inter_gbs)
        for name, (trainer, options) in exchanges.items():
            _, rows = simulate_run(RunConfig(workload=w, trainer=trainer, world_size=64,
                                             trainer_options=options), cluster, ".")
            for row in rows:
                assert row["step_time_ms"] >= row["link_ms"] * (1 - 1e-12), (inter_gbs, name, row)
                if row["shared_link_ms"] > 0:
                    overflowed.add(name)
    # The slow networks make the prioritized exchange's hidden transfers (the next step's
    # final rows in the backward, beside the all-reduce) overflow: the check above is not
    # vacuous where sharing matters. (The overlapped one hides nothing as built.)
    assert "prioritized" in overflowed


def test_the_planner_plans_with_its_predicted_costs_and_the_cluster_books_the_true_ones(
        monkeypatch, tmp_path):
    """FreeScale balances what its cost model predicts. Where the cluster's costs grow as
    the length squared (the planted fit) and the trainer predicts with FLOPs (mostly
    linear at `medium`'s width: freescale.cost=analytical), its plan is off and the error
    shows as residual straggler; with the same fit stored for it to load (cost=auto), it plans with the
    true costs. The simulator used to hand every planner the true costs."""
    from fsbench.costmodel.fit import fit_path
    from fsbench.scaling import simulate

    over = {"wall_ms": 0.0, "cpu_ms": 0.0, "busy_ms": 0.0, "input_ms": 0.0}
    fit = planted_fit(a=0.01, b=0.0, batch_ms=0.0, bucket_ms=0.0,
                      step_overhead={"freescale/model": over, "freescale/emulated": over})
    monkeypatch.setattr(simulate, "Costs", local_with(fit))
    w = dataclasses.replace(get_workload("medium"), global_batch_size=256, steps=8, warmup=1)
    path = fit_path(tmp_path, w, "cpu")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(dataclasses.asdict(fit)))

    def straggler(cost):
        summary, _ = simulate_run(RunConfig(workload=w, trainer="freescale", world_size=4,
                                            trainer_options={"tables": "replicated", "cost": cost}),
                                  CLUSTERS["local"], tmp_path)
        return summary["straggler_bubble_ratio"]

    off, exact = straggler("analytical"), straggler("auto")
    assert off > 0.005 and exact < off / 100, (off, exact)


# Each FreeScale switch alone, on a base that leaves the rest off or neutral: (switch,
# base options, the value that turns it on, the summary key it moves, which way, at how
# many GPUs). The directions are the real trainer's as built (freescale_impl.sharded_step):
# balancing lowers the straggler share, the window the steps' summed max where whales are
# (small per-rank batches of long histories), prioritizing the exposed communication (the
# next step's final rows fly during the backward). Overlapping alone hides the later
# chunks under the earlier sub-batches' forwards (sub-batch c waits for chunk c only) and
# the later chunks' gradients under the earlier sub-batches' backwards (only chunk 0's
# follow DDP's last bucket); so more chunks hide more than the latency each adds here
# (16 against 2 at 64 GPUs: 15/16 of the gradients leave during the backward, not 1/2),
# with the dense part in one bucket after the backward (DDP's 25 MiB) on both sides: every
# dense gradient is made in sub-batch 0's backward, so with smaller buckets more chunks
# also shrink the window the dense all-reduce hides under (the test after this one);
# the SM-free transport (inside a node: it refuses across nodes) adds its two barriers
# an exchange.
NO_LAUNCHES = dataclasses.replace(H100, name="no-launches", layer_overhead_ms=0.0)
SHARDED_OFF = {"tables": "sharded", "balance": "off", "overlap": "off", "priority": "off",
               "transport": "collective", "chunks": "4"}
SWITCHES = [
    ("balance", SHARDED_OFF, "on", "straggler_bubble_ratio", "lower", 64),
    ("window", {**SHARDED_OFF, "balance": "on"}, "4", "step_time_ms_mean", "lower", 64),
    ("overlap", SHARDED_OFF, "on", "exposed_comm_ratio", "lower", 64),
    ("priority", {**SHARDED_OFF, "overlap": "on"}, "on", "exposed_comm_ratio", "lower", 64),
    ("chunks", {**SHARDED_OFF, "overlap": "on", "chunks": "2"}, "16", "exposed_comm_ratio", "lower", 64),
    ("transport", {**SHARDED_OFF, "overlap": "on"}, "sm_free", "step_time_ms_mean", "higher", 8),
]


def switch_workload(gpus: int, per_gpu: int, dense_bucket_mb: float | None = None):
    w = get_workload("medium")
    return dataclasses.replace(w, steps=8, warmup=0, global_batch_size=gpus * per_gpu,
                               item_vocab=10_000_000, user_vocab=10_000_000,
                               context_vocabs=(1_000_000,), popularity="zipf:0.3",
                               dense_bucket_mb=dense_bucket_mb or w.dense_bucket_mb)


@pytest.mark.parametrize("switch, base, on, moved, way, gpus", SWITCHES, ids=[s[0] for s in SWITCHES])
def test_each_switch_alone_moves_the_projection_the_way_the_trainer_moves(switch, base, on, moved, way, gpus):
    # Long heavy-tailed histories, 4 samples per GPU (a 1,024-long history then costs
    # more than a GPU's fair share: whales), a large catalogue (few rows come back: what
    # prioritizing can hide), at 64 GPUs (across nodes). Prioritizing at 16 samples per
    # GPU: at 4, chunk 0's rows arrive under the step's control read (its host sync)
    # without it, so there is nothing left for it to hide once the first step's control
    # message no longer queues behind the rows on every link (fsbench.scaling.step_engine).
    # Chunks at 16 too: a rank cuts its samples into at most one sub-batch a sample.
    per_gpu = 16 if switch in ("priority", "chunks") else 4
    w = switch_workload(gpus, per_gpu, dense_bucket_mb=25.0 if switch == "chunks" else None)

    # The SM-free transport's barriers alone: without launches, whose gaps (4 launch-bound
    # passes a step here, tests/test_simulated_schedule.py) would hide them.
    cluster = NO_LAUNCHES if switch == "transport" else H100

    def run(options):  # the step's model alone: no input stage timed on this CPU
        return simulate_run(RunConfig(workload=w, trainer="freescale", world_size=gpus,
                                      trainer_options=options), cluster, ".", planner_time=False)[0]
    before, after = run(base)[moved], run({**base, switch: on})[moved]
    if way == "lower":
        assert after < before * 0.995, (switch, before, after)
    elif way == "higher":
        assert after > before * 1.005, (switch, before, after)
    else:
        assert after >= before, (switch, before, after)


def test_more_chunks_leave_the_dense_all_reduce_less_backward_to_hide_under():
    """Every dense gradient is made in sub-batch 0's backward, 1/C of the backward with C
    chunks (freescale_impl.step_schedule): FreeScale's program replayed on fixed times (a
    2 ms backward, buckets ready half-way and at the end, each all-reduce 0.8 ms, the
    exchanges free) exposes more of the dense all-reduce the more chunks it has."""
    from fsbench.scaling.step_engine import replay

    profile = profile_of("freescale", {**SHARDED_OFF, "overlap": "on"}, 64)
    buckets = [Bucket(4.0, 0.5), Bucket(3.0, 1.0)]

    def dense_exposed(chunks: int) -> float:
        program = profile.program(buckets, 8, chunks)
        ran = replay(program, lambda comm: 0.8 if comm.payload == "dense_grads" else 0.0,
                     {"forward": 1.0, "backward": 2.0})
        return sum(ms for name, ms in ran.exposed_by.items() if name.startswith("ddp.allreduce"))

    one, two, four = dense_exposed(1), dense_exposed(2), dense_exposed(4)
    # one chunk: the first bucket hides under the backward's second half, the last is exposed
    assert one == pytest.approx(0.8, abs=1e-9)
    assert one < two < four


def test_a_planner_slower_than_the_step_is_input_stall():
    """The plan is timed at the simulated size: hidden while it is shorter than the step,
    an input stall of the difference when longer. FreeScale's planner against steps of
    ~100 ms, then a planner made to take 40 ms of CPU per window against steps under a
    millisecond; the baselines plan nothing."""
    import time

    from fsbench.scaling.sim_inputs import contiguous_plan

    def slow_plan(lengths, n, inputs):
        t0 = time.thread_time_ns()
        while time.thread_time_ns() - t0 < 40e6:
            pass
        plans, _ = contiguous_plan(lengths, n)
        return plans, (time.thread_time_ns() - t0) / 1e6

    w = small(64 * 8)
    run = RunConfig(workload=w, trainer="freescale", world_size=8)
    fs = simulate_run(run, SLOW, ".")[0]  # steps of ~100 ms
    assert fs["input_stall_ratio"] == 0.0
    assert 0 < fs["plan_ms_per_step"] < fs["step_time_ms_median"]
    assert simulate_run(dataclasses.replace(run, trainer="ddp"), H100, ".")[0]["plan_ms_per_step"] == 0.0
    exact = simulate_run(run, H100, ".", planner_time=False)[0]
    assert exact["input_stall_ratio"] == 0.0
    slow, rows = simulate_run(run, H100_ONE_WORKER, ".", profile=SimProfile(plan=slow_plan))
    for row in rows:
        assert row["plan_ms"] >= 40.0
        assert row["step_time_ms"] == pytest.approx(row["plan_ms"], rel=1e-9)  # the plan sets the pace
        assert row["input_stall_ms"] >= 8 * (row["plan_ms"] - exact["step_time_ms_median"]) * 0.9
    assert slow["input_stall_ratio"] > 0.8


def test_freescale_routing_is_timed_at_the_simulated_size_and_the_baselines_route_nothing():
    """FreeScale with sharded tables routes every step in its input stage: the real
    RoutedShare is timed at the simulated world size (CPU time, > 0; no claim on how much,
    which is this CPU's); DDP, and FreeScale with replicated tables, route nothing."""
    w = small(64 * 8)
    run = RunConfig(workload=w, trainer="freescale", world_size=8)
    fs = simulate_run(run, H100, ".")[0]
    assert fs["route_ms_per_step"] > 0 and fs["route_extrapolated"] is False
    assert simulate_run(dataclasses.replace(run, trainer="ddp"), H100, ".")[0]["route_ms_per_step"] == 0.0
    replicated = dataclasses.replace(run, trainer_options={"tables": "replicated"})
    assert simulate_run(replicated, H100, ".")[0]["route_ms_per_step"] == 0.0
    assert simulate_run(run, H100, ".", planner_time=False)[0]["route_ms_per_step"] == 0.0


def test_a_routing_slower_than_the_step_is_input_stall():
    """Planning and routing are one input stage: together they stall every rank once they
    outlast the step (a routing of 30 ms against H100 steps under a millisecond), at the
    pace input_workers loader workers on cores host_cpu_speed times this one's keep: one
    worker 31 ms a step, four 31 / 4, four twice as fast 31 / 8. The rank thread's
    exchange preparation paces the step alone (it is one thread's), by the host's speed."""
    from freescale_impl.routing_cost import StageTimes

    base = profile_of("freescale", {}, 8)
    slow = dataclasses.replace(base, route=lambda *args: StageTimes(30.0, 2.0))
    run = RunConfig(workload=small(64 * 8), trainer="freescale", world_size=8)
    for cluster, pace in ((H100_ONE_WORKER, 31.0), (H100, 31.0 / 4),
                          (dataclasses.replace(H100, host_cpu_speed=2.0), 31.0 / 8)):
        summary, rows = simulate_run(run, cluster, ".", profile=slow, planner_ms=1.0)
        for row in rows:
            assert (row["route_ms"], row["prep_ms"]) == (30.0, 2.0)
            assert row["step_time_ms"] == pytest.approx(pace, rel=1e-9)  # the stage sets the pace
        assert summary["input_stall_ratio"] > 0.8
        assert summary["input_ms_per_step"] == pytest.approx(33.0)  # this machine's CPU, as measured runs say
    prep_bound = dataclasses.replace(base, route=lambda *args: StageTimes(1.0, 12.0))
    rows = simulate_run(run, H100, ".", profile=prep_bound, planner_ms=1.0)[1]
    assert all(r["step_time_ms"] == pytest.approx(12.0, rel=1e-9) for r in rows)


def test_the_input_routings_collectives_are_booked_pipelined_and_the_sharded_baseline_routes_on_the_device():
    """FreeScale's exchanged routing books its request exchange (counts, ids, fresh masks)
    and TorchRec its input dist (lengths and ids) at the cluster's alpha-beta cost, hidden
    under a step's compute (pipelined over the steps before): exposed only beyond it, on
    slow links. Host routing and ddp book none; TorchRec routes nothing on the host."""
    run = RunConfig(workload=small(64 * 8), trainer="freescale", world_size=8)
    exchanged = simulate_run(run, H100, ".", planner_time=False)[1]
    host = simulate_run(dataclasses.replace(run, trainer_options={"routing": "host"}), H100, ".",
                        planner_time=False)[1]
    torchrec = simulate_run(dataclasses.replace(run, trainer="torchrec"), H100, ".", planner_time=False)
    assert all(r["input_exchange_ms"] > 0 for r in exchanged)
    assert all(r["input_exchange_ms"] == 0 for r in host)
    assert all(r["input_exchange_ms"] > 0 for r in torchrec[1])
    assert torchrec[0]["route_ms_per_step"] == 0.0 and torchrec[0]["plan_ms_per_step"] == 0.0
    # Hidden while the compute covers it: the step is unchanged by it (same plan, same
    # rows) but for the SMs its NCCL kernels take from the compute they overlap, and the
    # host's read of the exchanged counts (a host sync: tests/test_simulated_schedule.py).
    # From the second step on: the first exchanges its own requests before it can start.
    no_sm = dataclasses.replace(H100, sm_slowdown=0.0, host_sync_s=0.0)
    for e, h in zip(simulate_run(run, no_sm, ".", planner_time=False)[1][1:],
                    simulate_run(dataclasses.replace(run, trainer_options={"routing": "host"}), no_sm, ".",
                                 planner_time=False)[1][1:]):
        assert e["step_time_ms"] == pytest.approx(h["step_time_ms"], rel=1e-9)
    # Links a million times slower: the exchange outlasts the compute and shows.
    crawl = dataclasses.replace(H100, intra_gbs=H100.intra_gbs / 1e6, inter_gbs=H100.inter_gbs / 1e6)
    slow_e = simulate_run(run, crawl, ".", planner_time=False)[1]
    slow_h = simulate_run(dataclasses.replace(run, trainer_options={"routing": "host"}), crawl, ".",
                          planner_time=False)[1]
    assert all(e["step_time_ms"] > h["step_time_ms"] for e, h in zip(slow_e, slow_h))


def test_routing_beyond_the_timed_tokens_follows_the_line_through_two_smaller_batches(monkeypatch):
    """A global batch beyond TIMED_TOKENS is timed at two smaller batches (at the same
    world size) and the line through them followed, for the worker's routing and the rank
    thread's preparation alike: planted costs of 2 ms + 1 us per token (and half of it)
    give exactly that at 10x the limit; below the limit the batch itself is timed."""
    from freescale_impl import routing_cost

    seen = []

    def planted(workload, n, *args, **kwargs):
        tokens = 10.0 * workload.global_batch_size
        seen.append((workload.global_batch_size, n))
        return 2.0 + 1e-3 * tokens, 1.0 + 0.5e-3 * tokens, tokens
    monkeypatch.setattr(routing_cost, "_stage_ms", planted)
    monkeypatch.setattr(routing_cost, "TIMED_TOKENS", 10_000)
    w = small(10_000)
    got = routing_cost.stage_times(w, 16, 0, None, None, 1, "exchanged", 100_000.0)
    assert got.extrapolated and got.route_ms == pytest.approx(2.0 + 100.0)
    assert got.prep_ms == pytest.approx(1.0 + 50.0)
    assert all(b * 10 <= 10_000 and n == 16 for b, n in seen) and len(seen) == 2
    got = routing_cost.stage_times(small(500), 16, 0, None, None, 1, "exchanged", 5_000.0)
    assert not got.extrapolated and got.route_ms == pytest.approx(7.0) and seen[-1] == (500, 16)


def test_local_loader_worker_takes_the_timed_stage_only_where_the_fit_measured_it_apart(monkeypatch):
    """On `local` the loader worker's CPU is what 1-rank runs measured beyond the input
    stage (`stage_ms` held beside it) plus the stage timed at the simulated size; at 2
    ranks on 2 cores it all preempts the ranks. A fit from before holds the worker's whole
    CPU, to which nothing is added."""
    from fsbench.scaling import simulate

    from freescale_impl.routing_cost import StageTimes

    route = dataclasses.replace(profile_of("freescale", {}, 2), route=lambda *args: StageTimes(6.0))
    over = {"wall_ms": 0.0, "cpu_ms": 0.0, "busy_ms": 0.0, "input_ms": 0.0, "worker_ms": 1.0}
    steps = {}
    for label, entry in (("net", {**over, "stage_ms": 4.0}), ("whole", over)):
        fit = planted_fit(step_overhead={"freescale/model": entry})
        monkeypatch.setattr(simulate, "Costs", local_with(fit))
        run = RunConfig(workload=small(64), trainer="freescale", world_size=2)
        steps[label] = simulate_run(run, CLUSTERS["local"], ".", profile=route, planner_ms=2.0)[1]
    for net, whole in zip(steps["net"], steps["whole"]):
        # 2 workers on 2 busy cores: each core's share of them lengthens the step
        assert net["step_time_ms"] - whole["step_time_ms"] == pytest.approx(2 * (2.0 + 6.0) / 2, rel=1e-9)


def test_sharded_data_books_the_sample_exchange_blocking_and_plans_on_the_ranks_thread():
    """freescale.data=sharded: the lengths all-gather and the planned samples' two
    all-to-alls are booked in the step (blocking: the step grows by them), and the plan
    and request, made on the rank's thread, pace the step alone (no loader worker can
    plan: it holds one shard), where data=replicated spreads them over the workers."""
    from freescale_impl.routing_cost import StageTimes

    run = RunConfig(workload=small(64 * 8), trainer="freescale", world_size=8)
    sharded = dataclasses.replace(run, trainer_options={"data": "sharded"})
    rows = simulate_run(sharded, H100, ".", planner_time=False)[1]
    replicated = simulate_run(run, H100, ".", planner_time=False)[1]
    assert all(r["sample_exchange_ms"] > 0 for r in rows)
    assert all(r["sample_exchange_ms"] == 0 for r in replicated)
    for s, r in zip(rows, replicated):  # same plan, same rows: the step grows by the exchange,
        # and by what of the rows' flight the replicated step hid under its first
        # sub-batches: the blocking exchange queues behind those rows on the link
        assert s["step_time_ms"] >= (r["step_time_ms"] + s["sample_exchange_ms"]) * (1 - 1e-9)
    slow = lambda *args: StageTimes(20.0, 1.0)  # noqa: E731
    for opts, pace in (({"data": "sharded"}, 2.0 + 20.0 + 1.0), ({}, (2.0 + 20.0) / 4)):
        prof = dataclasses.replace(profile_of("freescale", opts, 8), route=slow)
        rows = simulate_run(dataclasses.replace(run, trainer_options=opts), H100, ".", profile=prof,
                            planner_ms=2.0)[1]
        assert all(r["step_time_ms"] == pytest.approx(pace, rel=1e-9) for r in rows), opts
