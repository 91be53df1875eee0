"""Is a gloo collective slower when the ranks' CPU work precedes it on a shared host?

For each world size, real gloo ranks on this machine time three loops (median of 7 after
2 warm-up, the slowest rank's time): the collective alone; `--spin-ms` of CPU work per
rank then a barrier (the CPU work's cost, time-shared); the CPU work then the collective.
If (spin + collective) - (spin + barrier) is about the collective alone, the collective
is not slowed by the CPU work before it, and what a simulator misses lies elsewhere (how
many collectives a step issues, and in what order). Used by results/sim_validation_cpu.md.

    python scripts/collective_under_load.py --world-sizes 4,8,16 --mbytes 1.2 --spin-ms 13
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time


def spin(ms: float) -> None:
    t0 = time.thread_time()
    while time.thread_time() - t0 < ms / 1e3:
        pass


def rank_main(rank: int, world: int, port: int, nbytes: int, spin_ms: float, out: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    buf = torch.ones(max(1, nbytes // 4))
    found = {}
    for mode in ("collective alone", "CPU work + barrier", "CPU work + collective"):
        times = []
        for i in range(9):
            dist.barrier()
            t0 = time.perf_counter()
            if mode != "collective alone":
                spin(spin_ms)
            if mode == "CPU work + barrier":
                dist.barrier()
            else:
                dist.all_reduce(buf)
            took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            if i >= 2:
                times.append(float(took))
        found[mode] = statistics.median(times) * 1e3
    if rank == 0:
        with open(out, "w") as f:
            json.dump(found, f)
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    from fsbench.running.launch.local import free_port

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-sizes", default="4,8,16")
    ap.add_argument("--mbytes", type=float, default=1.2, help="all-reduce buffer per rank, MB")
    ap.add_argument("--spin-ms", type=float, default=13.0, help="CPU work per rank before it, ms")
    args = ap.parse_args()
    print("| ranks | all-reduce alone ms | CPU work + barrier ms | CPU work + all-reduce ms | added by the all-reduce ms |")
    print("|--:|--:|--:|--:|--:|")
    for world in map(int, args.world_sizes.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "found.json")
            mp.start_processes(rank_main, args=(world, free_port(), int(args.mbytes * 1e6), args.spin_ms, out),
                               nprocs=world, start_method="spawn")
            with open(out) as f:
                r = json.load(f)
        alone, base, both = r["collective alone"], r["CPU work + barrier"], r["CPU work + collective"]
        print(f"| {world} | {alone:.1f} | {base:.1f} | {both:.1f} | {both - base:.1f} |")


if __name__ == "__main__":
    main()
