"""The input stage at scale (issue 41): a rank's input stage does O(local batch + N) work
under exchanged routing, its CPU is reported per step in every summary (reading data left
out), and `fsbench micro input-stage` times it per world size."""
from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest

from fsbench.measurement.run_summary import input_stage_cpu
from fsbench.scaling import input_stage_micro as ism
from fsbench.training import inputs as inputs_mod
from fsbench.training.trainer import StepInput
from fsbench.workloads.presets import tiny
from freescale_impl import embedding_exchange, routing
from freescale_impl.balance import analytical_cost
from freescale_impl.routing_cost import time_steps
from freescale_impl.trainer import FreeScaleOptions


def test_the_input_stage_cpu_leaves_out_the_sources_reading(monkeypatch):
    """A planted clock: the preparer's thread spends 7 ms, 5 of which the source spent
    making the global batch; the stage is the other 2."""
    clock = iter([0, 7_000_000])
    monkeypatch.setattr(inputs_mod.time, "thread_time_ns", lambda: next(clock))

    class Source:
        read_ns = 0

        def global_batch(self, step):
            self.read_ns += 5_000_000

    source = Source()

    def prepare(step):
        source.global_batch(step)
        return StepInput(step, [], 0, 0)
    item, stage_ns = inputs_mod.prepare_timed(prepare, 3, source)
    assert item.step == 3 and stage_ns == 2_000_000


def test_reading_a_share_leaves_out_the_sources_making_of_the_global_batch(monkeypatch):
    """BalancedShare.read: the CPU of taking the rank's samples, with the planning and the
    source's generation of the global batch (MeteredSource.read_ns) left out."""
    from fsbench.training.inputs import MeteredSource
    from fsbench.workloads.generator import SyntheticBatches
    from freescale_impl.balanced_share import BalancedShare

    w = dataclasses.replace(tiny(), global_batch_size=64)
    source = MeteredSource(SyntheticBatches(w, 0))
    share = BalancedShare(source, 0, 4, analytical_cost(w), FreeScaleOptions(), steps=2)
    from freescale_impl import partition

    # One thread clock: read() starts at 0; the source makes the batch from 1 to 7 ms;
    # read() ends at 9 ms. The plan (contiguous, patched in) reads no clock.
    clock = iter([0, 1_000_000, 7_000_000, 9_000_000])
    monkeypatch.setattr(inputs_mod.time, "thread_time_ns", lambda: next(clock))
    monkeypatch.setattr(share, "plan", lambda lengths: partition.contiguous(analytical_cost(w)(lengths), 4))
    local, plan, read_ms = share.read(0)
    assert read_ms == pytest.approx(3.0) and local.batch_size == 16


def test_summary_input_ms_is_the_workers_stage_plus_the_ranks_exchange_prep_over_measured_steps():
    spans = pd.DataFrame([
        # step 0 is warm-up: its 50 ms of preparation count nowhere
        {"rank": r, "step": k, "name": name, "cpu_ns": cpu, "overhead_ns": 0, "warmup": k == 0}
        for r in (0, 1) for k in (0, 1, 2)
        for name, cpu in (("forward", 9_000_000), ("emb.route", 1_000_000 if r == 0 else 3_000_000))])
    inputs = [(r, {"stage_cpu_ns": {"0": 50_000_000, "1": 4_000_000, "2": 6_000_000}}) for r in (0, 1)]
    stats = pd.DataFrame([{"rank": r, "step": k, "route_ms": 1.5, "read_ms": 0.5}
                          for r in (0, 1) for k in (0, 1, 2)])
    out = input_stage_cpu(inputs, spans, stats)
    assert out["input_worker_stage_ms_per_step"] == pytest.approx(5.0)
    assert out["exchange_prep_ms_per_step"] == pytest.approx(2.0)  # (1 + 3) / 2 ranks
    assert out["input_ms_per_step"] == pytest.approx(7.0)
    assert out["route_ms_per_step"] == 1.5 and out["read_ms_per_step"] == 0.5
    # An emulated run books a span's real CPU as overhead_ns (its cpu_ns is emulated compute).
    emulated = spans.assign(overhead_ns=spans["cpu_ns"], cpu_ns=0)
    assert input_stage_cpu(inputs, emulated, stats)["exchange_prep_ms_per_step"] == pytest.approx(2.0)
    # A run recorded before the stage was timed: unknown, not zero.
    assert input_stage_cpu([(0, {"worker_cpu_ns": {}})], spans, stats) == {"input_ms_per_step": None}


@pytest.mark.parametrize("n", [2, 8, 32])
def test_exchanged_routing_builds_one_request_a_step_at_any_world_size(monkeypatch, n):
    """Scale by construction: under exchanged routing a rank's input stage builds its own
    request only (host routing builds every rank's: n a step)."""
    calls = []
    real = embedding_exchange.build_request

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(routing, "build_request", counted)
    w = dataclasses.replace(tiny(), global_batch_size=4 * n)
    for used, per_step in (("exchanged", 1), ("host", n)):
        calls.clear()
        rows = time_steps(w, n, 0, analytical_cost(w), FreeScaleOptions(), 1, used, repeats=2)
        assert len(calls) == 3 * per_step, used  # steps 0..2 (0 untimed)
        assert len(rows) == 2 and all(r["local_samples"] >= 1 for r in rows)
        assert all(r["prep_ms"] > 0 for r in rows) == (used == "exchanged")


def test_micro_rows_summarize_each_part_and_the_routings_growth():
    steps = [{"plan_ms": p, "read_ms": 0.5, "route_ms": 2.0, "prep_ms": 1.0, "local_samples": 4,
              "local_tokens": 40, "global_tokens": 400} for p in (1.0, 2.0, 3.0)]
    big = [dict(s, route_ms=4.0) for s in steps]
    rows = ism.with_growth([ism.summarize(64, "exchanged", big), ism.summarize(8, "exchanged", steps)])
    small, large = sorted(rows, key=lambda r: r["ranks"])
    assert small["plan_median_ms"] == 2.0 and small["routing_median_ms"] == 3.0
    assert small["stage_median_ms"] == pytest.approx(5.5)
    assert small["routing_vs_smallest"] == 1.0 and large["routing_vs_smallest"] == pytest.approx(5.0 / 3.0)
    with pytest.raises(Exception, match="--ranks"):
        ism.check_args([], 128, 3)


def test_micro_input_stage_command_prints_each_size_and_routing(capsys):
    from fsbench.cli import main

    code = main(["micro", "input-stage", "--workload", "tiny", "--ranks", "1,4",
                 "--routing", "auto,host", "--repeats", "2", "--set", "batch_per_rank=3",
                 "--format", "json"])
    assert code == 0
    record = json.loads(capsys.readouterr().out)
    got = [(r["ranks"], r["routing"]) for r in record["rows"]]
    assert got == [(1, "host"), (1, "host"), (4, "exchanged"), (4, "host")]  # auto: the rule
    assert all(r["local_samples"] >= 1 for r in record["rows"])
    assert record["batch_per_rank"] == 3


def test_host_routing_is_refused_beyond_one_node_in_one_line():
    """routing=host is O(N x local batch) a step on every rank: asked for at more ranks than
    one node holds, the run is refused before any rank starts, naming what to use."""
    from fsbench.config import ConfigError, RunConfig
    from fsbench.training.trainer import check_run
    from fsbench.workloads.presets import tiny
    from freescale_impl.routing import HOST_ROUTING_LIMIT_RANKS

    def run(n: int, routing: str) -> RunConfig:
        return RunConfig(workload=dataclasses.replace(tiny(), global_batch_size=n), trainer="freescale", world_size=n,
                         trainer_options={"routing": routing})

    check_run(run(HOST_ROUTING_LIMIT_RANKS, "host"))
    check_run(run(1024, "exchanged"))
    check_run(run(1024, "auto"))
    with pytest.raises(ConfigError, match=r"routing=host at 16 ranks: .*use freescale.routing=exchanged or auto"):
        check_run(run(16, "host"))
    # and the simulator projects no run the trainer refuses
    from fsbench.scaling.simulate import profile_of

    profile_of("freescale", {"routing": "host"}, HOST_ROUTING_LIMIT_RANKS)
    with pytest.raises(ConfigError, match=r"routing=host at 1024 ranks"):
        profile_of("freescale", {"routing": "host"}, 1024)
