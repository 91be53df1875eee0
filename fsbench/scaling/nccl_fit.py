"""`fsbench calibrate --comm --from-nccl-tests LOG...`: a cluster's collectives as its own
nccl-tests logs measured them, stored where `--cluster local` finds a comm fit
(fsbench.scaling.commcal.comm_fit_path), so that `fsbench simulate --cluster local` and
`fsbench cluster --cluster local` price collectives with them.

At a world size and GPUs per node that a log measured, a collective's time is read off
that log's curve (interpolated in log-log between its message sizes: nccl-tests measures
every power of two, and NCCL's protocol changes between them bend the curve more than one
latency-plus-bandwidth line follows); elsewhere the model of fsbench.scaling.collectives
with the figures fitted on all the logs (`fit_figures`).
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
from pathlib import Path

import numpy as np

from fsbench.errors import ConfigError
from fsbench.scaling.collectives import Figures, collective_s, fit_figures
from fsbench.scaling.nccl_tests import NcclTestsRun



@dataclasses.dataclass(frozen=True)
class NcclTestsFit:
    """One collective's measured curves and the cluster's fitted figures: what
    fsbench.scaling.sim_costs.Costs asks of a comm fit (`seconds`, `cpu_seconds`)."""
    collective: str
    figures: dict
    points: list  # [world_size, gpus_per_node, bytes, seconds]

    @property
    def gpus_per_node(self) -> int:
        """The logs' GPUs a node (their most common): the default topology."""
        return int(self.figures["gpus_per_node"])

    @functools.cached_property
    def curves(self) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]:
        """(N, G) -> (sizes, seconds), sorted by size, a size's median where repeated."""
        out = {}
        for key in sorted({(int(p[0]), int(p[1])) for p in self.points}):
            pts = [(p[2], p[3]) for p in self.points if (int(p[0]), int(p[1])) == key]
            sizes = np.unique([s for s, _ in pts])
            times = np.array([np.median([t for s2, t in pts if s2 == s]) for s in sizes])
            out[key] = (sizes.astype(float), times)
        return out

    def seconds(self, n: int, nbytes: float, gpus_per_node: int | None = None) -> float:
        if n <= 1 or nbytes <= 0:
            return 0.0
        g = gpus_per_node or self.gpus_per_node
        curve = self.curves.get((n, g))
        if curve is None or len(curve[0]) < 2:
            return self.model_seconds(n, nbytes, g)
        sizes, times = curve
        if nbytes <= sizes[0]:
            return float(times[0])  # below the smallest message: its latency
        if nbytes >= sizes[-1]:  # beyond the largest: at the last two points' bandwidth
            slope = (times[-1] - times[-2]) / (sizes[-1] - sizes[-2])
            return float(times[-1] + max(slope, 0.0) * (nbytes - sizes[-1]))
        return float(np.exp(np.interp(np.log(nbytes), np.log(sizes), np.log(times))))

    def model_seconds(self, n: int, nbytes: float, gpus_per_node: int | None = None) -> float:
        return collective_s(Figures(self.figures), self.collective, n, nbytes, gpus_per_node)

    def cpu_seconds(self, n: int, nbytes: float) -> float:
        """NCCL's work is on the GPU: no host CPU is booked (as for the GPU presets)."""
        return 0.0



def fits_from_runs(runs: list[NcclTestsRun]) -> tuple[dict[str, NcclTestsFit], dict, dict]:
    """(collective -> fit, the fitted figures, how each was found) from parsed logs."""
    points = [p for r in runs for p in r.points]
    try:
        figures, how = fit_figures(points)
    except ValueError as e:
        raise ConfigError(f"--from-nccl-tests: {e}") from None
    missing = [k for k in ("intra_gbs", "inter_gbs") if k not in figures]
    if missing:
        raise ConfigError(f"--from-nccl-tests: {' and '.join(missing)} cannot be measured from these logs "
                          f"(intra_gbs: a one-node all_gather_perf or alltoall_perf with messages of 32 MiB "
                          f"or more; inter_gbs: a multi-node alltoall_perf of 32 MiB or more)")
    fits = {c: NcclTestsFit(c, figures, [[p.world_size, p.gpus_per_node, p.bytes, p.time_us * 1e-6]
                                         for p in points if p.collective == c])
            for c in sorted({p.collective for p in points})}
    return fits, figures, how


def store_nccl_fits(path: Path, runs: list[NcclTestsRun]) -> tuple[dict[str, NcclTestsFit], dict, dict]:
    """Fit and write the comm fit file (atomically), replacing what was there."""
    from fsbench.files import write_json_atomic

    fits, figures, how = fits_from_runs(runs)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {
        "backend": "nccl-tests", "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "logs": sorted({r.path for r in runs}),
        "nccl_versions": sorted({r.nccl_version for r in runs if r.nccl_version}),
        "figures": figures, "figures_from": how,
        "fits": {c: {"collective": c, "points": f.points} for c, f in fits.items()}})
    return fits, figures, how


def read_nccl_fits(raw: dict) -> dict[str, NcclTestsFit]:
    """The fits of a stored file written by store_nccl_fits."""
    return {c: NcclTestsFit(c, raw["figures"], f["points"]) for c, f in raw["fits"].items()}

