"""Collective costs from nccl-tests: the log parser across nccl-tests 2.x layouts, the one
collective model (fsbench.scaling.collectives) and its fit, the h100 preset fitted on
committed published results, `fsbench cluster` and `calibrate --comm --from-nccl-tests`."""
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from fsbench.cli import main
from fsbench.errors import ConfigError
from fsbench.scaling.collectives import bus_factor, collective_s, fit_figures, published_figures, published_points
from fsbench.scaling.nccl_tests import NcclTestsPoint, parse_log, read_logs
from fsbench.scaling.sim_inputs import CLUSTERS, Cluster

LOGS = Path(__file__).parent / "assets" / "nccl_tests"
H100 = CLUSTERS["h100"]


# --- reading logs ---------------------------------------------------------------------

def test_a_2_17_log_with_two_tests_gives_each_its_collective_ranks_hosts_and_rows():
    a2a, ar = parse_log(LOGS / "two_tests_2.17.log")
    assert (a2a.collective, a2a.world_size, a2a.hosts, a2a.gpus_per_node) == ("all_to_all", 4, 2, 2)
    assert [p.bytes for p in a2a.points] == [32 << 20, 64 << 20, 128 << 20]
    assert [p.time_us for p in a2a.points] == [1000.0, 1900.0, 3700.0]  # out-of-place, not in-place
    assert a2a.nccl_version == "2.29.2" and a2a.tests_version == "2.17.8"  # from nccl-headers=22902
    assert ar.collective == "all_reduce" and [p.time_us for p in ar.points] == [20.0, 12586.1]
    assert ar.points[1].busbw_gbs == 127.97 and ar.points[1].source.endswith(":35")


def test_a_2_9_log_without_group_root_or_wrong_columns_is_read_by_its_file_name():
    (run,) = parse_log(LOGS / "all_gather_perf_2.9.log")
    assert (run.collective, run.world_size, run.gpus_per_node, run.hosts) == ("all_gather", 8, 8, 1)
    assert [(p.bytes, p.time_us, p.busbw_gbs) for p in run.points] == [(1 << 20, 40.0, 22.94), (2 << 20, 60.0, 30.58)]
    assert run.nccl_version == "2.10.3"


def test_launcher_prefixes_and_a_timestamp_column_are_read_and_the_collective_can_be_named():
    with pytest.raises(ConfigError, match="give it as COLLECTIVE=PATH with COLLECTIVE one of all_reduce"):
        parse_log(LOGS / "srun_prefixed.log")
    (run,) = parse_log(f"all_reduce={LOGS / 'srun_prefixed.log'}")
    assert (run.collective, run.world_size, run.gpus_per_node) == ("all_reduce", 2, 1)
    assert [(p.bytes, p.time_us) for p in run.points] == [(8 << 20, 400.0), (16 << 20, 700.0)]


def test_per_iteration_columns_do_not_shift_the_in_place_half():
    (run,) = parse_log(LOGS / "reduce_scatter_perf_per_iteration.log")
    assert run.collective == "reduce_scatter" and [(p.time_us, p.busbw_gbs) for p in run.points] == [(30.0, 17.48)]


def test_hosts_of_different_sizes_and_unreadable_or_empty_logs_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match="hosts hold different numbers of ranks"):
        parse_log(LOGS / "alltoall_uneven.log")
    with pytest.raises(ConfigError, match="cannot read it"):
        parse_log(tmp_path / "missing.log")
    (tmp_path / "alltoall_perf.log").write_text("hello\n")
    with pytest.raises(ConfigError, match="no test found"):
        parse_log(tmp_path / "alltoall_perf.log")
    with pytest.raises(ConfigError, match="give one or more nccl-tests logs"):
        read_logs([])


# --- the model ------------------------------------------------------------------------

FIG = Cluster("t", "test", "flops", gpus_per_node=8, intra_gbs=360.0, nvls_gbs=480.0, inter_gbs=48.0,
              nic_share=0.9, alpha_s=5e-6, ring_peer_s=7e-6, a2a_peer_s=4e-6)


def test_across_nodes_a_ring_uses_every_nic_of_a_node_and_an_all_to_all_one():
    big = 64 << 30  # the fixed costs a fraction of a percent
    for g in (1, 2, 4, 8):
        n = 10 * g
        ring = bus_factor("all_gather", n) * big / collective_s(FIG, "all_gather", n, big, g) / 1e9
        a2a = bus_factor("all_to_all", n) * big / collective_s(FIG, "all_to_all", n, big, g) / 1e9
        assert ring == pytest.approx(min(360.0, g * 48.0 * 0.9), rel=0.02)  # G NICs, up to NVLink
        assert a2a < 48.0 * (n - 1) / (n - g) * 1.01  # one NIC a GPU: the NVLink share aside
    # inside a node: NVLink, and NVLS for an all-reduce of more than two GPUs
    assert bus_factor("all_reduce", 8) * big / collective_s(FIG, "all_reduce", 8, big) / 1e9 == pytest.approx(480, rel=0.01)
    assert bus_factor("all_reduce", 2) * big / collective_s(FIG, "all_reduce", 2, big) / 1e9 == pytest.approx(360, rel=0.01)


def test_fixed_costs_grow_with_the_ranks_and_differ_per_collective():
    tiny = 8.0
    t = {n: collective_s(FIG, "all_to_all", n, 32 << 20) - collective_s(FIG, "all_to_all", n, 0.5 * (32 << 20)) * 0
         for n in (16, 64, 256)}
    assert t[16] < t[64] < t[256]
    assert collective_s(FIG, "all_reduce", 8, tiny) == pytest.approx(3 * 5e-6, rel=0.01)  # log2 8 steps
    # a ring's per-rank cost across nodes is in full from 32 MiB, and a share of it below
    full = collective_s(FIG, "all_reduce", 80, 32 << 20) - collective_s(FIG, "all_reduce", 80, 32 << 20, 80)
    assert full > 79 * 7e-6 * 0.99
    assert collective_s(FIG, "all_to_all", 80, tiny) < collective_s(FIG, "all_reduce", 80, 32 << 20)


def synthetic_points(fig, sizes, layouts):
    """What nccl-tests would print on a cluster that follows the model exactly."""
    out = []
    for c, n, g in layouts:
        for s in sizes:
            t = collective_s(fig, c, n, s, g)
            out.append(NcclTestsPoint(c, n, g, s, t * 1e6, bus_factor(c, n) * s / t / 1e9, "synthetic"))
    return out


def test_the_fit_recovers_the_figures_of_a_cluster_that_follows_the_model():
    layouts = [(c, 8, 8) for c in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")] + [
        (c, 10 * g, g) for g in (1, 8) for c in ("all_reduce", "all_gather", "all_to_all")]
    sizes = [8, 1 << 10, 1 << 16] + [(32 << 20) << k for k in range(6)]
    figures, how = fit_figures(synthetic_points(FIG, sizes, layouts))
    for name in ("gpus_per_node", "intra_gbs", "nvls_gbs", "inter_gbs", "nic_share", "alpha_s",
                 "ring_peer_s", "a2a_peer_s"):
        assert figures[name] == pytest.approx(getattr(FIG, name), rel=0.03), (name, how.get(name))
    # a figure the logs cannot show comes from `given`, and a fit never overrides it
    single = [p for p in synthetic_points(FIG, sizes, layouts[:4])]
    figures, how = fit_figures(single, {"inter_gbs": 50.0})
    assert figures["inter_gbs"] == 50.0 and how["inter_gbs"] == "given" and "nic_share" not in figures


def test_the_h100_preset_is_the_fit_of_its_committed_published_points():
    figures, how, sources = published_figures()
    assert len(sources) >= 5 and all(s.startswith("https://") for s in sources)
    for name, value in figures.items():
        assert getattr(H100, name) == pytest.approx(value), name
        assert name not in H100.assumed  # measured
    assert {"peak_tflops", "mfu", "sm_slowdown"} <= set(H100.assumed)
    data = json.loads((Path(__file__).parents[1] / "fsbench/scaling/data/h100_nccl_tests.json").read_text())
    for s in data["sources"]:  # each source says where, when, which NCCL, what hardware, and its use
        assert {"address", "date", "nccl_version", "topology", "use", "points"} <= set(s)
    # published shape: NVLS beats the ring in a node, 8 NICs beat one across nodes
    assert H100.nvls_gbs > H100.intra_gbs > 8 * H100.inter_gbs * 0.7 > H100.inter_gbs


# --- the commands ---------------------------------------------------------------------

def test_cluster_prints_a_row_per_collective_world_size_and_size(capsys):
    assert main(["cluster", "--collectives", "all_reduce,alltoall", "--world-sizes", "8,80",
                 "--bytes", "32MiB,1GiB", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert len(rows) == 8 and {r["collective"] for r in rows} == {"all_reduce", "all_to_all"}
    for r in rows:
        assert set(r) == {"collective", "world_size", "gpus_per_node", "bytes", "ms", "busbw_gbs"}
        assert r["ms"] == pytest.approx(collective_s(H100, r["collective"], r["world_size"], r["bytes"],
                                                     r["gpus_per_node"]) * 1e3)


def test_cluster_compare_puts_each_log_point_beside_its_prediction(capsys):
    assert main(["cluster", "--compare", str(LOGS / "two_tests_2.17.log"), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["points"] == 5 and len(out["rows"]) == 5
    for r in out["rows"]:
        assert r["gpus_per_node"] == 2 and r["world_size"] == 4
        assert r["ratio"] == pytest.approx(r["predicted_ms"] / r["measured_ms"])
    assert main(["cluster", "--compare", str(LOGS / "two_tests_2.17.log"), "--min-bytes", "64MiB"]) == 0
    text = capsys.readouterr().out
    assert "of 3 points within 0.75-1.33x" in text


def test_calibrate_from_nccl_tests_then_local_reproduces_the_logs_and_simulates(tmp_path, capsys):
    """A fit on logs of a cluster that follows the model: `--cluster local` then gives each
    logged point back (read off its curve) and the model elsewhere; simulate runs on it."""
    layouts = [(c, 8, 8) for c in ("all_reduce", "all_gather", "all_to_all")] + [
        (c, 16, 8) for c in ("all_reduce", "all_gather", "all_to_all")]
    sizes = [8, 1 << 16] + [(32 << 20) << k for k in range(4)]
    logs = []
    for c, n, g in layouts:
        log = tmp_path / f"{c}_{n}.log"
        rows = "".join(f"{p.bytes:>12} {p.bytes // 4:>12} float sum -1 {p.time_us:.6g} 0.0 {p.busbw_gbs:.6g} 0 "
                       f"{p.time_us:.6g} 0.0 {p.busbw_gbs:.6g} 0\n"
                       for p in synthetic_points(FIG, sizes, [(c, n, g)]))
        ranks = "".join(f"#  Rank {r:2d} Group  0 Pid {100 + r} on node{r // g} device {r % g} [0x18] NVIDIA H100\n"
                        for r in range(n))
        log.write_text("# nThread 1 nGpus 1 minBytes 8 maxBytes 8 step: 2(factor) warmup iters: 5 iters: 20\n"
                       + ranks + "#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n"
                       + rows)
        logs.append(f"{'alltoall' if c == 'all_to_all' else c}={log}")
    store = tmp_path / "S"
    assert main(["calibrate", "--comm", "--from-nccl-tests", *logs, "--store", str(store), "--format", "json"]) == 0
    fitted = json.loads(capsys.readouterr().out)["figures"]
    assert fitted["inter_gbs"] == pytest.approx(48.0, rel=0.05)
    assert main(["cluster", "--cluster", "local", "--store", str(store), "--compare", *logs, "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["points"] == len(layouts) * len(sizes)
    assert all(r["ratio"] == pytest.approx(1.0, rel=1e-3) for r in out["rows"])  # 4 digits printed
    # elsewhere (256 ranks, not in any log): the fitted model, within a few percent of the truth
    from fsbench.scaling.commcal import load_comm_fits

    fits = load_comm_fits(store)
    truth = collective_s(FIG, "all_to_all", 256, 64 << 20)
    assert fits["all_to_all"].seconds(256, 64 << 20) == pytest.approx(truth, rel=0.05)
    # simulate --cluster local runs on it (with this machine's encoder fit, planted here)
    from fsbench.costmodel.fit import fit_path
    from fsbench.files import write_json_atomic
    from fsbench.workloads.presets import get_workload
    from test_simulate import planted_fit

    import torch

    torch.set_num_threads(1)  # simulate's: the fit's key holds the thread count
    w = get_workload("small")
    path = fit_path(store, w, "cpu")
    write_json_atomic(path, dataclasses.asdict(planted_fit(table_optimizer=w.table_optimizer,
                                                           table_ns_per_element=1.0)))
    assert main(["simulate", "--cluster", "local", "--store", str(store), "--workload", "small",
                 "--trainers", "ddp,freescale", "--world-sizes", "16", "--steps", "3", "--warmup", "1",
                 "--set", "batch_per_rank=8", "--planner-time", "off", "--format", "json"]) == 0
    table = json.loads(capsys.readouterr().out)["table"]
    assert len(table) == 2 and all(math.isfinite(r["step_time_ms_median"]) for r in table)


@pytest.mark.parametrize("argv, expected", [
    (["cluster", "--bytes", "32XB"], "is not a size"),
    (["cluster", "--collectives", "broadcast"], "collective 'broadcast': allowed: all_reduce"),
    (["cluster", "--cluster", "local", "--store", "/nonexistent-store"], "no comm fit"),
    (["calibrate", "--from-nccl-tests", "x.log"], "give it with --comm"),
])
def test_bad_input_to_cluster_and_calibrate_is_one_line(capsys, argv, expected):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err


def test_nccl_tests_points_match_nccl_tests_bus_bandwidth_definition():
    (run,) = parse_log(LOGS / "all_gather_perf_2.9.log")
    for p in run.points:  # busbw = size / time * (n-1)/n, as the log printed it
        assert p.busbw_gbs == pytest.approx(p.bytes / (p.time_us * 1e-6) / 1e9 * 7 / 8, abs=0.01)
    assert np.isclose(bus_factor("all_reduce", 8), 1.75)


def test_compare_published_checks_the_committed_runs_never_fitted_on(capsys):
    """`--compare published`: the multi-node all-reduce runs below 32 MiB, each from a source
    with an address, predicted at its own size; none of them is among the fitted points."""
    assert main(["cluster", "--compare", "published", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    checked = published_points("checked")
    fitted = {(p.collective, p.world_size, p.bytes, p.time_us) for p in published_points("fitted")}
    assert len(doc["rows"]) == len(checked) >= 40
    assert not {(p.collective, p.world_size, p.bytes, p.time_us) for p in checked} & fitted
    assert all(r["source"].startswith("https://") and r["world_size"] > 8 for r in doc["rows"])
    assert min(r["bytes"] for r in doc["rows"]) < 32 << 20  # what the fit has no point of
    for r in doc["rows"]:
        assert r["predicted_ms"] == pytest.approx(collective_s(H100, "all_reduce", r["world_size"], r["bytes"], 8) * 1e3)
