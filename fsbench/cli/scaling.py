"""`fsbench simulate` and `fsbench calibrate`: scaling studies' entry points
(fsbench.cli holds the rest and dispatches here through `COMMANDS`)."""
from __future__ import annotations

import argparse
import dataclasses
from typing import Callable

from fsbench.cli.args import add_format, add_store, path_arg, rename
from fsbench.errors import ConfigError
from fsbench.running.output_paths import check_writable_dir
from fsbench.table import dumps, grid, note

# `--set` keys of the simulator itself (everything else is a workload field or a switch).


def add_parsers(sub, csv: Callable, default_store: str) -> None:
    from fsbench.scaling.sim_inputs import CLUSTERS, FIGURES

    p = sub.add_parser(
        "simulate", help="SIMULATED step time and bubbles at 8..1024 GPUs (calibrated model)",
        description="Project each (trainer, world size) with the calibrated simulator "
                    "(fsbench/scaling/simulate.py: per-sample compute cost, an alpha-beta model per "
                    "collective, each trainer's split and overlap) over the workload's real "
                    "sampled batches. Writes one run per (trainer, world size) with summary.json "
                    "in the measured schema and \"simulated\": true, into STORE/simulated (or "
                    "--sim-store), apart from measured runs. Clusters: "
                    + "; ".join(f"{c.name}: {c.description}" for c in CLUSTERS.values()))
    p.add_argument("--workload", default="small", help="workload preset")
    p.add_argument("--trainers", type=csv(str), default=["ddp", "freescale"], help="comma-separated")
    p.add_argument("--world-sizes", type=csv(int), default=[8, 64, 256, 1024], help="comma-separated")
    p.add_argument("--cluster", default="h100", metavar="NAME|FILE",
                   help=f"what is simulated: a preset ({', '.join(sorted(CLUSTERS))}) or a cluster "
                        "file (.toml or .json: name, description, the figures it sets, and "
                        "`measured`, the figures it measured, `encoder_fit`; docs/simulation.md)")
    p.add_argument("--cluster-fit", metavar="FIT.json",
                   help="a GPU cluster's encoder as measured: a `fsbench calibrate --device cuda` "
                        "fit (STORE/calibrations/*.json) whose costs per sample, per batch and "
                        "per table element replace peak_tflops x mfu, layer_overhead_ms and "
                        "table_ns_per_element (then measured, not assumed); FreeScale plans "
                        "with it too")
    p.add_argument("--cluster-set", action="append", default=[], metavar="FIGURE=VALUE",
                   help=f"override one of the cluster's figures ({', '.join(FIGURES)}); it then "
                        "counts as assumed in every output")
    p.add_argument("--planner-time", default="measured", choices=["measured", "off"],
                   help="measured: FreeScale's input stage at the simulated size (its planning "
                        "and, with sharded tables, its routing) is timed on this CPU and is input "
                        "stall where it outlasts the step; off: charged nothing, so the output "
                        "does not depend on this machine (e.g. a CI check of simulated numbers) "
                        "and shows the step alone")
    p.add_argument("--sensitivity", action="store_true",
                   help="instead of storing runs: take each ASSUMED figure of the cluster at half "
                        "and twice its value and tabulate how the second trainer's bubble "
                        "reduction against the first (1 - bubble/bubble of the first) moves, per "
                        "world size (weak scaling)")
    p.add_argument("--scaling", default="weak", choices=["weak", "strong"],
                   help="weak: batch_per_rank samples per rank at every size; "
                        "strong: the workload's global batch at every size")
    p.add_argument("--steps", type=int, help="steps per simulated run, warm-up included; "
                                             "default: the workload's")
    p.add_argument("--warmup", type=int, help="leading steps left out of the summary; "
                                              "default: the workload's")
    p.add_argument("--seed", type=int, default=0, help="data seed")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="batch_per_rank=N (weak scaling; default 128), a workload field, or "
                        "a trainer switch (freescale.window=4, freescale.balance=off, ...)")
    add_store(p, "the store: calibrations are read from STORE/calibrations (--cluster local), "
                 "simulated runs go to STORE/simulated", default=default_store)
    p.add_argument("--sim-store", metavar="DIR", type=path_arg,
                   help="where simulated runs go instead of STORE/simulated")
    rename(p, "--out", "--sim-store", "sim_store")  # its meaning before: where simulated runs go
    add_format(p)

    p = sub.add_parser("calibrate", help="measure per-sample cost vs length; fit a*L^2+b*L+c",
                       description="Time forward+backward of the workload's model on this device "
                                   "over a grid of lengths, fit a*L^2 + b*L + c (least squares on "
                                   "relative error), report R^2 and store the fit in "
                                   "STORE/calibrations/, where the FreeScale balancer, "
                                   "compute=emulated and fsbench simulate find it.")
    p.add_argument("--workload", default="small", help="workload preset")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a workload field (e.g. model.dim=32)")
    add_store(p, "the store the fits go to (STORE/calibrations/)", default=default_store, old="--out")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="what is timed")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per length (median)")
    p.add_argument("--passes", type=int, default=3,
                   help="measure everything this many times, one pass after another, and fit "
                        "the medians (each length's, each batch's, each figure's): on a shared host two calibrations in a row "
                        "moved a 2-rank prediction by 14%%; 1 is three times faster")
    p.add_argument("--comm", action="store_true",
                   help="instead: time gloo all-reduce and all-to-all on local ranks and fit "
                        "an alpha-beta model per collective (for fsbench simulate --cluster local)")
    p.add_argument("--comm-world-sizes", type=csv(int), default=[2, 4, 8],
                   help="world sizes --comm measures")
    p.add_argument("--from-nccl-tests", nargs="+", metavar="LOG",
                   help="with --comm: measure nothing; fit the collectives on a GPU cluster's "
                        "nccl-tests logs (all_reduce_perf, alltoall_perf, all_gather_perf, "
                        "reduce_scatter_perf output, any 2.x version; COLLECTIVE=LOG where neither "
                        "the log nor its name says which ran). At the world sizes and GPUs per node "
                        "the logs measured their curves, elsewhere the model of "
                        "fsbench/scaling/collectives.py fitted on them; stored where --cluster local "
                        "finds a comm fit (it replaces one there)")
    p.add_argument("--overhead", type=csv(str), default=[], metavar="TRAINERS",
                   help="also measure these trainers' per-step overhead beyond the cost model "
                        "(a real 1-rank run each, with the model and emulated) and how much "
                        "time-sharing ranks beyond the cores meet (emulated runs at four and at "
                        "eight times the cores), for fsbench simulate --cluster local; e.g. "
                        "ddp,freescale; default: none")
    add_format(p)


def cmd_simulate(args: argparse.Namespace) -> int:
    import pandas as pd

    from fsbench.cli.run_config import build_workload, parse_sets, pop_batch_per_rank
    from fsbench.columns import FLAGS, RUN_VIEW
    from fsbench.config import RunConfig
    from fsbench.scaling.sim_inputs import assumption_record, assumptions, load_cluster
    from fsbench.scaling.sim_costs import Costs
    from fsbench.scaling.simulate import scaled_workload, write_simulated
    from fsbench.table import format_table, progress, records
    from fsbench.training.trainer import trainer_options
    from fsbench.running import store

    batch_per_rank = pop_batch_per_rank(args)
    if not args.world_sizes or min(args.world_sizes) < 1:
        raise ConfigError(f"--world-sizes={args.world_sizes}: give world sizes >= 1")
    workload = build_workload(args)
    _, trainer_sets = parse_sets(args.set)
    cluster = load_cluster(args.cluster, args.cluster_set, args.cluster_fit)
    if cluster.compute == "fit":
        import torch

        torch.set_num_threads(1)  # the fits' key: the thread count ranks run with
    Costs(cluster, workload, args.store)  # a missing calibration fails here, in one line
    if args.sensitivity:
        return _print_sensitivity(args, cluster, workload, trainer_sets, batch_per_rank)
    sim_store = args.sim_store or f"{args.store}/{store.SIMULATED_DIR}"
    check_writable_dir(sim_store, "--sim-store" if args.sim_store else "--store")
    rows = []
    for trainer in progress([(t, n) for n in args.world_sizes for t in args.trainers], "simulating", "run"):
        name, n = trainer
        w = scaled_workload(workload, n, args.scaling, batch_per_rank)
        run = RunConfig(workload=w, trainer=name, world_size=n, seed=args.seed,
                        trainer_options=trainer_options(name, trainer_sets.get(name, {})))
        run_dir, summary = write_simulated(run, cluster, sim_store, args.store, args.scaling,
                                           planner_time=args.planner_time == "measured")
        rows.append({**summary, "run_dir": str(run_dir)})
    if args.format == "json":
        print(dumps({"simulated": True, "cluster": cluster.name,
                     "cluster_description": cluster.description,
                     "assumptions": assumption_record(cluster), "scaling": args.scaling,
                     "batch_per_rank": batch_per_rank if args.scaling == "weak" else None,
                     "table": records(pd.DataFrame(rows)), "store": sim_store}))
    else:
        print(f"SIMULATED ({cluster.name}: {cluster.description}); {args.scaling} scaling"
              + (f", {batch_per_rank} samples per rank" if args.scaling == "weak" else ""))
        print(assumptions(cluster))
        # The input stage beside the step: planning and routing timed on this CPU, input
        # stall where they outlast it.
        print(format_table(pd.DataFrame(rows), ["trainer", "world_size", *[
            c for c in RUN_VIEW if c in ("step_time_ms_median", "samples_per_s", "bubble_ratio",
                                         "straggler_bubble_ratio", "exposed_comm_ratio",
                                         "input_stall_ratio", "load_imbalance")],
            "plan_ms_per_step", "route_ms_per_step", "exchange_chunks", *[f for f in FLAGS if f in rows[0]]]))
    note(f"simulated runs stored in {sim_store}/")
    return 0


def _print_sensitivity(args, cluster, workload, trainer_sets: dict, batch_per_rank: int) -> int:
    from fsbench.scaling.sensitivity import FACTORS, sensitivity
    from fsbench.scaling.sim_inputs import assumptions
    from fsbench.table import progress
    from fsbench.training.trainer import trainer_options

    if len(args.trainers) != 2:
        raise ConfigError(f"--sensitivity compares two trainers (BASE,NEW); --trainers gave "
                          f"{len(args.trainers)}: {','.join(args.trainers)}")
    if not cluster.assumed:
        raise ConfigError(f"--sensitivity: cluster {cluster.name!r} assumes no figure (its costs are "
                          "measured on this machine); use a GPU preset or cluster file")
    base, new = args.trainers
    runs = [(t, trainer_options(t, trainer_sets.get(t, {}))) for t in (base, new)]
    rows = sensitivity(cluster, workload, runs, args.world_sizes, batch_per_rank, args.store,
                       args.seed, progress=lambda it: progress(it, "simulating", "point"),
                       planner_time=args.planner_time == "measured")
    if args.format == "json":
        print(dumps({"simulated": True, "sensitivity": rows, "base": base, "new": new,
                     "assumptions": assumptions(cluster)}))
        return 0
    print(f"SIMULATED sensitivity of {new}'s bubble reduction against {base} to each assumed "
          f"figure (x0.5, x1, x2; weak scaling, {batch_per_rank} samples per rank)")
    print(assumptions(cluster))
    pct = lambda v: "n/a" if v != v else f"{100 * v:.1f}%"  # noqa: E731
    print(grid(["figure", "value", "GPUs", *[f"x{k:g}" for k in FACTORS], "swing"],
               [[r["figure"], f"{r['value']:g} {r['unit']}".strip(), str(r["world_size"]),
                 *[pct(r[f"reduction_x{k:g}"]) for k in FACTORS], pct(r["swing"])] for r in rows],
               align=["left", "right", "right", *["right"] * (len(FACTORS) + 1)]))
    return 0


def cmd_calibrate_nccl_tests(args: argparse.Namespace) -> int:
    from fsbench.scaling.commcal import comm_fit_path
    from fsbench.scaling.nccl_fit import store_nccl_fits
    from fsbench.scaling.nccl_tests import read_logs
    from fsbench.scaling.sim_inputs import FIGURES

    runs = read_logs(args.from_nccl_tests)
    check_writable_dir(f"{args.store}/calibrations", "--store")
    path = comm_fit_path(args.store)
    replaced = path.exists()
    fits, figures, how = store_nccl_fits(path, runs)
    if args.format == "json":
        print(dumps({"figures": figures, "figures_from": how, "collectives": sorted(fits),
                     "logs": [{"path": r.path, "collective": r.collective, "world_size": r.world_size,
                               "gpus_per_node": r.gpus_per_node, "points": len(r.points),
                               "nccl_version": r.nccl_version} for r in runs],
                     "stored_in": path}))
    else:
        print(grid(["log", "collective", "ranks", "GPUs a node", "points", "NCCL"],
                   [[r.path, r.collective, str(r.world_size), str(r.gpus_per_node), str(len(r.points)),
                     r.nccl_version or "-"] for r in runs], align=["left", "left", *["right"] * 4]))
        print(grid(["figure", "value", "unit", "from"],
                   [[k, f"{v:.4g}", FIGURES[k][0], how.get(k, "")] for k, v in figures.items()],
                   align=["left", "right", "left", "left"]))
    note(f"stored in {path}" + (" (it replaced the comm fit there)" if replaced else ""))
    return 0


def cmd_calibrate_comm(args: argparse.Namespace) -> int:
    from fsbench.scaling.commcal import calibrate_comm, comm_fit_path
    from fsbench.table import progress

    if args.from_nccl_tests:
        return cmd_calibrate_nccl_tests(args)
    sizes = args.comm_world_sizes
    if not sizes or min(sizes) < 2:
        raise ConfigError(f"--comm-world-sizes={sizes}: give world sizes >= 2")
    check_writable_dir(f"{args.store}/calibrations", "--store")  # before measuring
    fits = calibrate_comm(args.store, sizes, progress=lambda it: progress(it, "world sizes", "size"))
    path = comm_fit_path(args.store)
    if args.format == "json":
        print(dumps({"collectives": {name: dataclasses.asdict(f) for name, f in fits.items()},
                     "stored_in": path}))
    else:
        rows = []
        for f in fits.values():
            bw = 1 / f.beta_s_per_byte / 1e6 if f.beta_s_per_byte > 0 else float("inf")
            n, nbytes, _ = max(f.points, key=lambda p: (p[1], p[0]))  # the largest message
            cpu = f.cpu_seconds(int(n), nbytes) / f.seconds(int(n), nbytes)
            rows.append([f.collective, f"{f.alpha0_s * 1e6:.1f}", f"{f.alpha1_s * 1e6:.1f}",
                         f"{bw:.0f}", f"{100 * f.max_rel_error:.0f}%", f"{100 * cpu:.0f}%"])
        print(grid(["collective", "alpha0 (us)", "alpha1 (us per rank)", "bandwidth (MB/s)",
                    "worst fit error", "other threads' CPU (largest message)"], rows,
                   align=["left", *["right"] * 5]))
    note(f"stored in {path}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from fsbench.costmodel.calibrate import calibrate
    from fsbench.costmodel.fit import fit_path
    from fsbench.table import progress

    if args.comm:
        return cmd_calibrate_comm(args)
    if args.from_nccl_tests:
        raise ConfigError("--from-nccl-tests fits collectives: give it with --comm "
                          "(fsbench calibrate --comm --from-nccl-tests LOG...)")

    from fsbench.cli.run_config import build_workload

    args.steps = args.warmup = None
    workload = build_workload(args)
    if args.repeats < 1:
        raise ConfigError(f"--repeats={args.repeats} must be >= 1")
    if args.passes < 1:
        raise ConfigError(f"--passes={args.passes} must be >= 1")
    if args.overhead:
        from fsbench.training.trainer import resolve_trainer_class

        for name in args.overhead:
            resolve_trainer_class(name)  # an unknown name fails now, in one line, not after calibrating
    check_writable_dir(f"{args.store}/calibrations", "--store")  # before measuring
    import torch
    torch.set_num_threads(1)  # the per-rank setting: costs must match what ranks see

    fit = calibrate(workload, args.store, device=args.device, repeats=args.repeats, passes=args.passes,
                    progress=lambda lengths: progress(lengths, "lengths", "length"))
    held, timeshare = {}, None
    if args.overhead:
        from fsbench.scaling.step_overhead import store_step_overheads
        from fsbench.scaling.timeshare import store_timeshare

        held = store_step_overheads(workload, args.overhead, args.store,
                                    progress=lambda it: progress(it, "runs", "run"))
        timeshare = store_timeshare(workload, args.overhead, args.store)
        if timeshare is None:
            note(f"time-sharing beyond the cores not measured: no collective fits in {args.store} "
                 f"(fsbench calibrate --comm first); simulations take full time-sharing")
    path = fit_path(args.store, workload, args.device)
    if args.format == "json":
        print(dumps({"fit": dataclasses.asdict(fit), "overheads": held, "timeshare": timeshare,
                     "stored_in": path}))
        note(f"stored in {path}")
        return 0
    square = "P(L)^2" if fit.padded else "L^2"  # P(L): the sample's padded (bucket) length
    print(f"cost(L) = {fit.a:.4g} {square} + {fit.b:.4g} L + {fit.c:.4g} ms   R^2 = {fit.r2:.4f}   "
          f"({fit.model} on {fit.device})")
    print(grid(["L", "measured ms/sample", "fit ms/sample"],
               [[str(L), f"{t:.4f}", f"{float(fit.cost_ms([L])[0]):.4f}"]
                for L, t in zip(fit.lengths, fit.per_sample_ms)]))
    print(f"per batch: {fit.batch_terms_text()}; tables: "
          f"{fit.table_ns_per_element:.2f} ns per updated element, a replica's "
          f"{fit.replicated_ns_per_element:.2f} ns per element per step"
          + (f"; co-run slowdown {fit.corun_slowdown:.2f}x (table work {fit.table_corun_slowdown:.2f}x)"
             if fit.corun_slowdown else ""))
    if fit.passes:
        print(f"median of {len(fit.passes)} passes; each pass's " + ", ".join(
            f"{name} {' '.join(f'{p[name]:.3g}' for p in fit.passes)}"
            for name in fit.passes[0] if all(p[name] is not None for p in fit.passes)))
    if held:
        print(grid(["trainer/compute", "overhead ms", "of it CPU", "busy", "input wait"],
                   [[key, *(f"{o[k]:.2f}" for k in ("wall_ms", "cpu_ms", "busy_ms", "input_ms"))]
                    for key, o in sorted(held.items())], align=["left", *["right"] * 4]))
    if timeshare:
        print("time-sharing beyond the cores: " + "; ".join(
            f"efficiency {at['efficiency']:.2f} at {at['ranks']} emulated ranks ("
            + ", ".join(f"{t} {e:.2f}" for t, e in sorted(at["per_trainer"].items())) + ")"
            for at in (timeshare, timeshare.get("wider")) if at))
    note(f"stored in {path}")
    return 0


COMMANDS = {"simulate": cmd_simulate, "calibrate": cmd_calibrate}
