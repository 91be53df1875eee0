"""The embedding exchange's chunk count, one rule for the trainer and the simulator. Where
the step can be priced (a GPU cluster, or this machine's fits), the count whose step,
replayed at each count, is shortest (fsbench.scaling.chunk_replay): fewer chunks where
each sub-batch's pass is launch-bound, more where compute dwarfs the launches and the
links. Else what one more chunk saves the forward against the link time it adds, on the
all-to-all's cost at the world size (fsbench.scaling.chunking): fewer chunks where the
collective's latency grows (many ranks), more where a chunk carries many bytes. An asked
count always wins."""
import dataclasses
import json

import pytest

from fsbench.config import ConfigError, RunConfig
from fsbench.scaling.chunking import CAP, GLOO_DEFAULT, MARGIN, a2a_model, choose_chunks
from fsbench.scaling.commcal import CommFit, comm_fit_path
from fsbench.scaling.sim_costs import expected_exchange_bytes
from fsbench.scaling.sim_inputs import CLUSTERS
from fsbench.scaling.simulate import profile_of, scaled_workload, simulate_run
from fsbench.training.step_program import Bucket
from fsbench.training.trainer import trainer_options
from fsbench.workloads.presets import get_workload
from freescale_impl.trainer import FreeScaleOptions, exchange_chunks

H100, H100_A2A = CLUSTERS["h100"], a2a_model("h100", "cuda", None)[0]


def weak(name: str, n: int, per_rank: int = 128):
    return scaled_workload(get_workload(name), n, "weak", per_rank)


def rule(w, n: int, a2a=H100_A2A) -> int:
    return choose_chunks(w, n, a2a, "h100").chunks


def alpha_beta(us_a_peer: float = 5.0, gb_s: float = 50.0):
    """An all-to-all with a fixed cost that grows with the ranks and one bandwidth."""
    return lambda n, b: (us_a_peer * (n - 1)) / 1e3 + b / (gb_s * 1e6)


def t_ms(a2a, w, n: int, c: int) -> float:
    return a2a(n, expected_exchange_bytes(w, n) / c)


def worth_it(a2a, w, n: int, c: int) -> bool:
    """Going from c-1 to c chunks saves the forward at least the link time it adds."""
    saved = t_ms(a2a, w, n, c - 1) - t_ms(a2a, w, n, c)
    return saved >= MARGIN * (c * t_ms(a2a, w, n, c) - (c - 1) * t_ms(a2a, w, n, c - 1))


def test_fewer_chunks_where_the_latency_grows_with_the_ranks():
    """On a model whose fixed cost grows with the ranks, 256 ranks get fewer chunks than 8
    (their bytes a rank the same: 128 samples a rank)."""
    a2a = alpha_beta()
    at8, at256 = rule(weak("medium", 8), 8, a2a), rule(weak("medium", 256), 256, a2a)
    assert 1 <= at256 < at8 <= CAP, (at8, at256)


def test_a_chosen_count_is_worth_its_latency_and_one_more_would_not_be():
    for a2a, name in ((H100_A2A, "h100"), (alpha_beta(), "alpha-beta")):
        for preset, n in (("medium", 8), ("medium", 256), ("large", 64), ("large", 1024)):
            w = weak(preset, n)
            c = choose_chunks(w, n, a2a, name)
            assert c.why == "rule" and c.model == name and c.world_size == n
            assert c.chunk_bytes == pytest.approx(expected_exchange_bytes(w, n) / c.chunks)
            assert all(worth_it(a2a, w, n, k) for k in range(2, c.chunks + 1)), (name, preset, n)
            if c.chunks < min(CAP, w.global_batch_size // n):
                assert not worth_it(a2a, w, n, c.chunks + 1), (name, preset, n, c.chunks)


def test_the_count_never_falls_as_a_rank_moves_more_bytes():
    # wider rows: more bytes a rank, the same ranks and rows (on a fixed-cost model: the
    # h100 model's per-peer cost shrinks below 32 MiB, so its count may step back there)
    counts = [rule(dataclasses.replace(weak("medium", 64), model=dataclasses.replace(
        get_workload("medium").model, table_dim=d)), 64, alpha_beta()) for d in (16, 64, 256, 1024, 4096)]
    assert counts == sorted(counts) and counts[0] < counts[-1], counts


def test_an_asked_count_wins_and_the_blocking_exchange_is_one():
    w = weak("medium", 256)
    assert choose_chunks(w, 256, H100_A2A, "h100", asked=3).chunks == 3
    assert choose_chunks(w, 256, None, None, asked=3).line() == "chunks=3 (asked)"
    assert choose_chunks(w, 256, H100_A2A, "h100", asked=3, blocking=True).chunks == 1
    assert choose_chunks(w, 1, H100_A2A, "h100").why == "one rank"
    opts = FreeScaleOptions.parse({"chunks": "3", "chunk_cluster": "local"})
    assert exchange_chunks(opts, w, 256, "cuda", None).why == "asked"  # no fit read: none needed


def test_a_chunk_holds_whole_samples():
    w = dataclasses.replace(weak("large", 64), global_batch_size=128)  # 2 samples a rank
    assert rule(w, 64) <= 2


def test_the_simulator_runs_the_count_the_rule_gives_at_each_world_size():
    """`fsbench simulate` chooses as the trainer would on that cluster (chunks=0), builds
    the program with that many chunks and says which count it used."""
    for n in (8, 256):
        w = dataclasses.replace(weak("medium", n), steps=3, warmup=1)
        run = RunConfig(workload=w, trainer="freescale", world_size=n,
                        trainer_options=trainer_options("freescale", {}))
        profile = profile_of("freescale", run.trainer_options, n)
        used = []

        def program(buckets, gpus_per_node, chunks, workload, growth=1.0, gpu=False, route="", build=profile.program):
            used.append(chunks)
            return build(buckets, gpus_per_node, chunks, workload, growth, gpu, route)

        summary, _ = simulate_run(run, H100, ".", profile=dataclasses.replace(profile, program=program),
                                  planner_time=False)
        expected = exchange_chunks(FreeScaleOptions.parse({}), w, n, "cuda", None)  # the trainer's
        # the rule replays the program at each count it tries; the step booked is the last
        assert used[-1] == expected.chunks and summary["exchange_chunks"] == expected.chunks
        assert expected.why == "replay" and used[:-1] == [int(k.split("x")[0]) for k in expected.predicted_ms]
        assert summary["exchange_chunks_why"] == expected.line()
        fetches = {op.comm.name for op in profile.program([Bucket(1.0, 1.0)], 8, used[0]).ops
                   if hasattr(op, "comm") and op.comm.name.startswith("emb.fetch_c")}
        assert len(fetches) == expected.chunks
    ddp = simulate_run(dataclasses.replace(run, trainer="ddp", trainer_options={}), H100, ".",
                       planner_time=False)[0]
    assert ddp["exchange_chunks"] is None  # no row exchange


def test_on_cpu_the_rule_reads_the_stores_gloo_fit_else_gloo_default(tmp_path):
    _, name = a2a_model("auto", "cpu", tmp_path)
    assert name == GLOO_DEFAULT
    # this repository's CPU workloads stay at one chunk on gloo, as measured
    # (results/freescale_comm_cpu.md)
    for wl in ("small", "comm-heavy", "tiny"):
        w = get_workload(wl)
        assert choose_chunks(w, 2, *a2a_model("auto", "cpu", tmp_path)).chunks == 1
    # a fit whose latency is tiny against its bandwidth's time: chunks pay there
    path = comm_fit_path(tmp_path)
    path.parent.mkdir(parents=True)
    fit = CommFit("all_to_all", 1e-7, 0.0, 1e-8, 0.0, [])
    path.write_text(json.dumps({"backend": "gloo", "fits": {"all_to_all": dataclasses.asdict(fit)}}))
    a2a, name = a2a_model("auto", "cpu", tmp_path)
    assert name == f"local ({path})" and choose_chunks(get_workload("small"), 2, a2a, name).chunks == CAP
    assert a2a_model("auto", "cuda", tmp_path)[1] == "h100"  # a GPU's default is the h100 model


def test_a_missing_or_unknown_cost_model_is_a_one_line_error(tmp_path):
    with pytest.raises(ConfigError) as e:
        a2a_model("local", "cpu", tmp_path)
    assert "freescale.chunk_cluster=local: no all_to_all fit" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError) as e:
        trainer_options("freescale", {"chunk_cluster": "h200"})
    assert str(e.value) == ("freescale.chunk_cluster='h200' is not allowed; choose auto, h100, local "
                            "or a cluster file (.toml, .json)")


def test_the_replayed_rule_takes_the_shortest_predicted_step_and_ties_to_fewer_chunks():
    from fsbench.scaling.chunk_replay import COUNTS, GROWTHS, TIE, candidate_name

    for preset, n, per_rank in (("medium", 256, 128), ("large", 256, 128), ("medium", 8, 2)):
        w = weak(preset, n, per_rank)
        c = exchange_chunks(FreeScaleOptions.parse({}), w, n, "cuda", None)  # the h100 model
        assert c.why == "replay" and c.model == "h100"
        # every count up to a rank's samples (whole samples), at each cut beyond one chunk
        assert list(c.predicted_ms) == [candidate_name(k, g) for k in COUNTS if k <= per_rank
                                        for g in (GROWTHS if k > 1 else (1.0,))]
        best = min(c.predicted_ms.values())
        assert c.predicted_ms[candidate_name(c.chunks, c.growth)] <= best * (1 + TIE)
        assert all(ms > best * (1 + TIE) for k, ms in c.predicted_ms.items()
                   if int(k.split("x")[0]) < c.chunks)
        assert c.line().startswith(f"chunks={c.chunks}") and f"(replay on h100 at {n} ranks" in c.line()


def test_under_a2a_auto_the_replay_routes_each_count_both_ways_and_the_simulator_runs_its_choice():
    """a2a=auto: every count and cut is replayed flat and in two hops (the first a tie's);
    the choice is the shortest, the trainer's and the simulator's alike. On one node
    (8 ranks, 8 a node) the two routes are the same step, so flat wins the tie."""
    from fsbench.scaling.chunk_replay import TIE, candidate_name

    opts = FreeScaleOptions.parse({"a2a": "auto"})
    for n in (8, 256):
        w = dataclasses.replace(weak("medium", n, 32), steps=3, warmup=1)
        c = exchange_chunks(opts, w, n, "cuda", None)
        names = list(c.predicted_ms)
        assert names[:2] == ["1 flat", "1 hierarchical"] and len(names) % 2 == 0
        best = min(c.predicted_ms.values())
        assert c.route in ("flat", "hierarchical")
        assert c.predicted_ms[candidate_name(c.chunks, c.growth, c.route)] <= best * (1 + TIE)
        if n == 8:
            assert c.predicted_ms["1 flat"] == c.predicted_ms["1 hierarchical"] and c.route == "flat"
        run = RunConfig(workload=w, trainer="freescale", world_size=n,
                        trainer_options=trainer_options("freescale", {"a2a": "auto"}))
        summary, _ = simulate_run(run, H100, ".", planner_time=False)
        assert summary["exchange_chunks_why"] == c.line()


def test_launch_bound_passes_get_one_chunk_and_long_compute_gets_many():
    """Each sub-batch is a pass that launches every layer again: `medium` at 32 samples a
    GPU computes less than its launches, so one chunk; `large` at 128 computes hundreds of
    milliseconds a step, against a few of exchange: more chunks than the links' rule caps."""
    opts = FreeScaleOptions.parse({})
    assert exchange_chunks(opts, weak("medium", 256, 32), 256, "cuda", None).chunks == 1
    assert exchange_chunks(opts, weak("large", 256, 128), 256, "cuda", None).chunks > CAP


def test_the_predicted_step_is_the_simulated_one_within_a_tenth():
    """The rule's estimate (a mean rank's encoder, expected payloads) against the
    simulator's booking of the same step (sampled batches, the balanced plan's slowest
    rank): the same program on the same costs, so within 10% on both sides of the
    launch-bound regime."""
    from fsbench.scaling.chunk_replay import candidate_name

    for preset, per_rank in (("medium", 128), ("large", 32)):
        w = dataclasses.replace(weak(preset, 256, per_rank), steps=6, warmup=2)
        run = RunConfig(workload=w, trainer="freescale", world_size=256,
                        trainer_options=trainer_options("freescale", {}))
        summary, rows = simulate_run(run, H100, ".", planner_time=False)
        chosen = exchange_chunks(FreeScaleOptions.parse({}), w, 256, "cuda", None)
        simulated = sum(r["step_time_ms"] for r in rows[w.warmup:]) / (w.steps - w.warmup)
        assert summary["exchange_chunks"] == chosen.chunks
        assert summary["exchange_chunks"] == chosen.chunks
        picked = chosen.predicted_ms[candidate_name(chosen.chunks, chosen.growth)]
        assert picked == pytest.approx(simulated, rel=0.10), (preset, simulated)


def test_on_cpu_without_fits_the_links_rule_stays(tmp_path):
    c = exchange_chunks(FreeScaleOptions.parse({}), get_workload("small"), 2, "cpu", tmp_path)
    assert c.why == "rule" and c.model == GLOO_DEFAULT
