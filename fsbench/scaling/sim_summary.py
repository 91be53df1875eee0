"""A simulated run's summary: the measured schema (fsbench.measurement.run_summary's keys),
computed from the simulator's per-step rows, flagged `simulated` and carrying the
cluster's assumptions."""
from __future__ import annotations

from fsbench.config import RunConfig
from fsbench.scaling.sim_inputs import Cluster, assumptions


def summarize_steps(run: RunConfig, rows: list[dict], cluster: Cluster,
                    route_extrapolated: bool = False, chunking=None) -> dict:
    """`chunking`: the row exchange's ChunkChoice (fsbench.scaling.chunking), None
    without one."""
    import pandas as pd

    df = pd.DataFrame(rows)
    m = df[df["step"] >= run.workload.warmup]
    cap, secs = m["capacity_ms"].sum(), m["step_time_ms"].sum() / 1e3
    bound = 1 - (m["busy_mean_ms"] / m["bound_busy_max_ms"]).mean()
    return {
        "run_id": None, "trainer": run.trainer, "workload": run.workload.name,
        "world_size": run.world_size, "seed": run.seed, "steps": run.workload.steps,
        "warmup": run.workload.warmup, "simulated": True, "emulated": False,
        "oversubscribed": False, "contended": False, "cluster": cluster.name,
        "assumptions": assumptions(cluster),  # which figures are assumed, in every output
        "steps_measured": int(len(m)),
        "step_time_ms_median": float(m["step_time_ms"].median()),
        # The plan at the simulated size, timed on this machine's CPU (not the cluster's
        # hosts'): MEASURED here, beside a SIMULATED step, as a run's summary gives it.
        "plan_ms_per_step": float(m["plan_ms"].mean()),
        "plan_share_of_step": float(m["plan_ms"].mean() / m["step_time_ms"].median()),
        # The routing likewise (FreeScale with sharded tables), and whether it was followed
        # on a line beyond the batches timed (freescale_impl.routing_cost).
        "route_ms_per_step": float(m["route_ms"].mean()),
        "exchange_prep_ms_per_step": float(m["prep_ms"].mean()),
        # The input stage's CPU per step as a measured run reports it (this machine's).
        "input_ms_per_step": float((m["plan_ms"] + m["route_ms"] + m["prep_ms"]).mean()),
        "input_exchange_ms_per_step": float(m["input_exchange_ms"].mean()),
        "route_extrapolated": route_extrapolated,
        # The chunks of the row exchange at this size, and why (the trainer's rule, asked)
        "exchange_chunks": chunking.chunks if chunking else None,
        "exchange_chunks_why": chunking.line() if chunking else None,
        "step_time_ms_mean": float(m["step_time_ms"].mean()),
        "samples_per_s": float(m["num_samples"].sum() / secs),
        "tokens_per_s": float(m["num_targets"].sum() / secs),
        "bubble_ratio": float(m["idle_ms"].sum() / cap),
        "straggler_bubble_ratio": float(m["straggler_ms"].sum() / cap),
        "exposed_comm_ratio": float(m["exposed_comm_ms"].sum() / cap),
        "input_stall_ratio": float(m["input_stall_ms"].sum() / cap),
        "other_idle_ratio": float(m["other_idle_ms"].sum() / cap),
        "load_imbalance": float(1 - m["busy_mean_ms"].sum() / m["busy_max_ms"].sum()),
        "whole_sample_bound_bubble": float(bound),
        "comm_overlap_ratio": None, "cpu_wait_ratio": None, "sm_occupancy": None,
        "peak_memory_mb": None,
    }
