"""Runs whose ranks another launcher started: torchrun (one agent per node) or SLURM's srun.

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \
        --rdzv-id job1 -m fsbench.cli run --workload small --trainer ddp --store /shared/runs

Every process is one rank running `fsbench run`. After joining the world, rank 0 creates
the run directory and tells every rank its path. Ranks then check that they see rank 0's
files: on a shared path every rank writes its own files there; where a node cannot see it,
its ranks send their files to rank 0 when they finish (`gather_files`). Rank 0 then
summarizes, exactly as after a local run; `fsbench summarize RUN_DIR` does the same for a
run whose rank 0 did not get that far. Step times across hosts use the clock offsets the
ranks measure after joining (fsbench.measurement.clock), never raw clocks of different hosts.
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path

from fsbench.config import ConfigError, RunConfig


def external_world() -> dict[str, int] | None:
    """{rank, world_size, local_rank, local_world_size} when torchrun or srun started this
    process, else None. srun's variables are copied to torchrun's names, which
    fsbench.training.dist reads."""
    env = os.environ
    if "TORCHELASTIC_RUN_ID" in env:  # torchrun (torch.distributed.run) sets it on every rank
        return {"rank": int(env["RANK"]), "world_size": int(env["WORLD_SIZE"]),
                "local_rank": int(env["LOCAL_RANK"]),
                "local_world_size": int(env.get("LOCAL_WORLD_SIZE", "1"))}
    if "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1")) > 1 and "SLURM_STEP_ID" in env:
        world = {"rank": int(env["SLURM_PROCID"]), "world_size": int(env["SLURM_NTASKS"]),
                 "local_rank": int(env.get("SLURM_LOCALID", "0")),
                 "local_world_size": int(env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0])}
        if "MASTER_ADDR" not in env:
            raise ConfigError("srun: set MASTER_ADDR (and MASTER_PORT) to the first node, e.g. "
                              "export MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -1)")
        env.setdefault("RANK", str(world["rank"]))
        env.setdefault("WORLD_SIZE", str(world["world_size"]))
        env.setdefault("LOCAL_RANK", str(world["local_rank"]))
        return world
    return None


def run_external(run: RunConfig, out_dir: str | Path) -> tuple[Path, dict | None]:
    """This process's part of a run another launcher started. Returns (run_dir, summary);
    the summary on rank 0 only (None elsewhere)."""
    import torch
    import torch.distributed as dist

    from fsbench.training import dist as fsdist
    from fsbench.running import runner
    from fsbench.running.launch.worker import record_failure, run_rank

    torch.set_num_threads(run.threads_per_rank)
    ctx = fsdist.init_distributed(run.resolved_backend, run.device)
    run_dir = None
    try:
        if ctx.world_size != run.world_size:
            raise ConfigError(f"--world-size {run.world_size} but the launcher started "
                              f"{ctx.world_size} ranks")
        box = [None, None]
        if ctx.is_main:
            run_dir = runner.prepare_run_dir(run, out_dir)
            box = [str(run_dir), secrets.token_hex(8)]
            (run_dir / f".shared-{box[1]}").touch()
        dist.broadcast_object_list(box, src=0, group=ctx.barrier_group)
        run_dir = Path(box[0])
        # FSBENCH_TEST_UNSHARED (tests only): act as a node that cannot see rank 0's path.
        shared = (run_dir / f".shared-{box[1]}").exists() and not os.environ.get("FSBENCH_TEST_UNSHARED")
        local_dir = run_dir if shared else Path(out_dir) / f"{run_dir.name}.node-rank-{ctx.rank}"
        local_dir.mkdir(parents=True, exist_ok=True)
        run_rank(ctx, run, local_dir)
        if not all(gather_flags(shared, ctx)):
            gather_files(local_dir, run_dir, ctx)
        dist.barrier(group=ctx.barrier_group)
        if ctx.is_main:
            (run_dir / f".shared-{box[1]}").unlink(missing_ok=True)
            return run_dir, runner.finish_run(run_dir)
        return run_dir, None
    except BaseException as e:
        if run_dir is not None:
            record_failure(Path(run_dir), ctx.rank, e, ctx)
            if ctx.is_main:
                runner.mark_stopped(Path(run_dir), e)
        raise
    finally:
        fsdist.shutdown()


def gather_flags(shared: bool, ctx) -> list[bool]:
    import torch.distributed as dist

    flags = [None] * ctx.world_size
    dist.all_gather_object(flags, shared, group=ctx.barrier_group)
    return flags


# A rank's files, as it leaves them: timelines, step stats, its monitor, input, memory,
# machine and clock records.
RANK_FILE_PATTERNS = ("rank-{r}.jsonl", "steps-rank-{r}.jsonl", "*-rank-{r}.json",
                      "*-rank-{r}.json.gz", "trainer-ran.json")


def gather_files(local_dir: Path, run_dir: Path, ctx) -> None:
    """Send every rank's own files to rank 0, which writes them into the run directory."""
    import torch.distributed as dist

    mine = {}
    for pattern in RANK_FILE_PATTERNS:
        for p in local_dir.glob(pattern.format(r=ctx.rank)):
            mine[p.name] = p.read_bytes()
    everyone = [None] * ctx.world_size if ctx.is_main else None
    dist.gather_object(mine, everyone, dst=0, group=ctx.barrier_group)
    if ctx.is_main:
        for files in everyone:
            for name, data in files.items():
                if not (run_dir / name).exists():
                    (run_dir / name).write_bytes(data)
