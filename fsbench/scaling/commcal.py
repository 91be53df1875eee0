"""`fsbench calibrate --comm`: an alpha-beta model per collective, fitted on the local backend.

For each collective the simulator uses (all-reduce of gradients, all-to-all of embedding
rows) and each world size in `world_sizes`, real ranks on this machine time the collective
over a range of message sizes (warm-up discarded, median of repeats, the slowest rank's
time, since a collective ends when its last rank does). One model per collective is then
fitted by least squares on relative error:

    all_reduce   t = alpha0 + alpha1 (N - 1) + beta * 2 (N - 1) / N * bytes
    all_to_all   t = alpha0 + alpha1 (N - 1) + beta * (N - 1) / N * bytes

(`bytes`: each rank's buffer; the ring all-reduce moves 2 (N-1)/N of it per rank, an
all-to-all (N-1)/N). Beside each time, the CPU the collective took on the rank's other
threads (gloo's, which carry it out while the calling thread waits; `cpu_points`, a line
per N): in a training step those threads compete for the cores with the compute they
overlap, which the simulator books (fsbench.scaling.simulate). The fit and every
measured point are stored in
STORE/calibrations/comm__<backend>__<host>.json, where `fsbench simulate --cluster local`
finds them.
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import os
import socket
import statistics
import time
from pathlib import Path
from typing import ClassVar

import numpy as np

COLLECTIVES = ("all_reduce", "all_to_all")
DEFAULT_SIZES = (4 << 10, 64 << 10, 512 << 10, 2 << 20, 8 << 20, 32 << 20)


def volume_factor(collective: str, n: int) -> float:
    """Share of a rank's buffer it sends (and receives) in the collective's algorithm."""
    return (2 if collective == "all_reduce" else 1) * (n - 1) / n


@dataclasses.dataclass(frozen=True)
class CommFit:
    collective: str
    alpha0_s: float
    alpha1_s: float
    beta_s_per_byte: float
    max_rel_error: float
    points: list  # [world_size, bytes, seconds]
    # [world_size, bytes, CPU seconds of the rank's other threads]; empty in fits from
    # before they were measured (the simulator then books no CPU for communication)
    cpu_points: list = dataclasses.field(default_factory=list)
    gpus_per_node: ClassVar[int | None] = None  # one host's ranks: no topology of nodes

    def seconds(self, n: int, nbytes: float, gpus_per_node: int | None = None) -> float:
        """(`gpus_per_node` is not used: these ranks share one host.) At a world size the
        calibration measured, its own line over the message sizes;
        between two measured sizes, the two lines' times interpolated in N; elsewhere the
        one model over all N. Why per N: on a host with fewer cores than ranks a
        collective's latency and per-byte cost both grow with N by time-sharing (gloo on 2
        cores: 4 KiB all-reduce 0.6 ms at 2 ranks, 73 ms at 16), which one alpha-beta
        model over N misses by several times at some sizes."""
        if n <= 1:
            return 0.0
        at = _between_lines(self.lines, n, nbytes)
        return self.model_seconds(n, nbytes) if at is None else at

    def cpu_seconds(self, n: int, nbytes: float) -> float:
        """CPU seconds the collective takes on a rank's other threads: each measured N's
        line, interpolated between two, beyond them the nearest measured N's; 0 in a fit
        without CPU points."""
        lines = self.cpu_lines
        if n <= 1 or not lines:
            return 0.0
        at = _between_lines(lines, n, nbytes)
        nearest = min(lines, key=lambda k: abs(k - n))
        return max(0.0, _line_seconds(lines[nearest], nbytes) if at is None else at)

    def model_seconds(self, n: int, nbytes: float) -> float:
        """The alpha-beta model over every measured N (beyond the measured world sizes)."""
        return (self.alpha0_s + self.alpha1_s * (n - 1)
                + self.beta_s_per_byte * volume_factor(self.collective, n) * nbytes)

    @functools.cached_property
    def lines(self) -> dict[int, tuple[float, float]]:
        """World size -> (latency s, s per byte of a rank's buffer), fitted on that N's
        points alone (relative least squares, both >= 0), where two or more sizes exist."""
        return _per_n_lines(self.points)

    @functools.cached_property
    def cpu_lines(self) -> dict[int, tuple[float, float]]:
        """The same of `cpu_points` (the simulator asks every step)."""
        return _per_n_lines(self.cpu_points)


def _per_n_lines(points: list) -> dict[int, tuple[float, float]]:
    """[N, bytes, seconds] points -> per N with two or more sizes, (intercept s, s per
    byte), relative least squares, both >= 0."""
    out = {}
    for n in sorted({int(p[0]) for p in points}):
        pts = np.array([(p[1], p[2]) for p in points if int(p[0]) == n], dtype=float)
        if len(np.unique(pts[:, 0])) < 2:
            continue
        design = np.stack([np.ones(len(pts)), pts[:, 0]], axis=1)
        w = 1.0 / np.maximum(pts[:, 1], 1e-9)  # a CPU point can be 0
        coef = np.linalg.lstsq(design * w[:, None], pts[:, 1] * w, rcond=None)[0]
        if coef[1] < 0:  # no per-byte cost visible: latency alone
            coef = np.array([float(np.median(pts[:, 1])), 0.0])
        elif coef[0] < 0:  # through the origin
            coef = np.array([0.0, float((pts[:, 0] @ pts[:, 1]) / (pts[:, 0] @ pts[:, 0]))])
        out[n] = (float(coef[0]), float(coef[1]))
    return out


def _between_lines(lines: dict[int, tuple[float, float]], n: int, nbytes: float) -> float | None:
    """A measured N's line, or the two nearest measured N's interpolated in N; None
    outside the measured sizes."""
    if n in lines:
        return _line_seconds(lines[n], nbytes)
    below = [k for k in lines if k < n]
    above = [k for k in lines if k > n]
    if not (below and above):
        return None
    lo, hi = max(below), min(above)
    share = (n - lo) / (hi - lo)
    return (1 - share) * _line_seconds(lines[lo], nbytes) + share * _line_seconds(lines[hi], nbytes)


def _line_seconds(line: tuple[float, float], nbytes: float) -> float:
    return line[0] + line[1] * nbytes


def fit(collective: str, points: list[tuple[int, int, float]]) -> CommFit:
    n = np.array([p[0] for p in points], dtype=float)
    b = np.array([p[1] for p in points], dtype=float)
    t = np.array([p[2] for p in points], dtype=float)
    design = np.stack([np.ones_like(n), n - 1, [volume_factor(collective, int(k)) * x
                                                for k, x in zip(n, b)]], axis=1)
    w = 1.0 / t
    coef, *_ = np.linalg.lstsq(design * w[:, None], t * w, rcond=None)
    coef = np.maximum(coef, 0.0)  # a negative latency or bandwidth term is noise
    rel = np.abs(design @ coef - t) / t
    return CommFit(collective, float(coef[0]), float(coef[1]), float(coef[2]),
                   float(rel.max()), [list(map(float, p)) for p in points])


def _rank_main(rank: int, world: int, port: int, sizes: list[int], repeats: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = []
    for coll in COLLECTIVES:
        for nbytes in sizes:
            numel = max(world, nbytes // 4 // world * world)  # all_to_all: divisible by N
            buf, out_buf = torch.ones(numel), torch.empty(numel)
            times, helper_cpu = [], []
            for i in range(repeats + 2):
                dist.barrier()
                # The CPU of this process's threads but this one (gloo's: the calling
                # thread waits while they carry the collective out).
                others0 = time.process_time() - time.thread_time()
                t0 = time.perf_counter()
                if coll == "all_reduce":
                    dist.all_reduce(buf)
                else:
                    dist.all_to_all_single(out_buf, buf)
                wall = time.perf_counter() - t0
                others = time.process_time() - time.thread_time() - others0
                elapsed = torch.tensor([wall], dtype=torch.float64)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the collective ends with its last rank
                if i >= 2:
                    times.append(float(elapsed))
                    helper_cpu.append(max(0.0, others))
            results.append([coll, world, numel * 4, statistics.median(times), statistics.median(helper_cpu)])
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()


def measure(world_sizes: list[int], sizes: list[int] = DEFAULT_SIZES, repeats: int = 7,
            progress=lambda it: it) -> dict[str, list[tuple[int, int, float]]]:
    import tempfile

    import torch.multiprocessing as mp

    from fsbench.running.launch.local import free_port

    points: dict[str, list] = {c: [] for c in COLLECTIVES}
    for world in progress(world_sizes):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "comm.json")
            mp.start_processes(_rank_main, args=(world, free_port(), list(sizes), repeats, out),
                               nprocs=world, start_method="spawn")
            for coll, n, nbytes, seconds, cpu_seconds in json.loads(Path(out).read_text()):
                points[coll].append((n, nbytes, seconds, cpu_seconds))
    return points


def comm_fit_path(store: str | Path, backend: str = "gloo") -> Path:
    return Path(store) / "calibrations" / f"comm__{backend}__{socket.gethostname()}.json"


def calibrate_comm(store: str | Path, world_sizes: list[int], sizes=DEFAULT_SIZES, repeats: int = 7,
                   progress=lambda it: it) -> dict[str, CommFit]:
    fits = {c: dataclasses.replace(fit(c, [p[:3] for p in pts]),
                                   cpu_points=[[float(n), float(b), float(cpu)] for n, b, _, cpu in pts])
            for c, pts in measure(world_sizes, sizes, repeats, progress).items()}
    path = comm_fit_path(store)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "backend": "gloo", "host": socket.gethostname(), "cpus": os.cpu_count(),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "fits": {c: dataclasses.asdict(f) for c, f in fits.items()}}, indent=1))
    return fits


def load_comm_fits(store: str | Path) -> dict | None:
    """The store's collective fits, collective -> fit (a CommFit measured here with gloo, or
    an NcclTestsFit from a cluster's nccl-tests logs: `calibrate --comm --from-nccl-tests`);
    None where none was made."""
    path = comm_fit_path(store)
    if not path.exists():
        return None
    raw = json.loads(path.read_text())
    if raw.get("backend") == "nccl-tests":
        from fsbench.scaling.nccl_fit import read_nccl_fits

        return read_nccl_fits(raw)
    return {c: CommFit(**f) for c, f in raw["fits"].items()}
