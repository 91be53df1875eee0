"""The stored cost fit: what `fsbench calibrate` measured on this device
(fsbench.costmodel.calibrate), keyed by model shape and device under
`<store>/calibrations/`, where the FreeScale balancer, the emulation
(fsbench.models.emulation) and the simulator (fsbench.scaling) read it; without a
matching fit the balancer uses an analytical model."""
from __future__ import annotations

import dataclasses
import platform
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fsbench.config import WorkloadConfig
from fsbench.costmodel.batch_terms import TOKENS_PER_POINT, bucket_count, footprint_excess, wide_excess
from fsbench.costmodel.cost_curve import quadratic_cost
from fsbench.files import read_json


@dataclass(frozen=True, slots=True)
class CostFit:
    a: float
    b: float
    c: float
    r2: float
    model: str
    device: str
    lengths: list[int]
    per_sample_ms: list[float]
    created: str = ""
    table_ns_per_element: float | None = None
    """The workload's table optimizer's step over an embedding table, per element (rows x dim)
    and step (slope between two table sizes): what a sharded trainer pays per updated
    row's element. None in fits made before it existed."""
    table_optimizer: str | None = None
    corun_slowdown: float | None = None
    """How much slower the encoder runs when every core of this host runs it at once
    (`corun_processes` processes) than alone: ranks that share a host's cores (and their
    caches, memory bandwidth, hyperthread siblings) pay it. None in older fits."""
    corun_processes: int | None = None
    batch_ms: float | None = None
    """A batch's encoder cost beyond its samples' cost(L): fixed, and per attention bucket
    (`bucket_ms`). None in fits made before they existed (then 0)."""
    bucket_ms: float | None = None
    replicated_ns_per_element: float | None = None
    """A replica's table work per step (dense gradients of every table, then the optimizer
    over every row), per element, at the workload's table sizes. None in older fits."""
    step_overhead: dict[str, dict[str, float]] | None = None
    """Per "trainer/compute" (compute: model or emulated): what a real 1-rank step costs
    beyond the simulator's model of it (framework and input work, a sharded trainer's row
    gathering and exchange calls), from a run at CALIBRATION_SEED
    (fsbench.scaling.step_overhead.measure_step_overhead; with compute=model, less the real
    encoder's drift from the fit at that moment, `encoder_drift`): `wall_ms` of it, of which `cpu_ms` the
    rank's own thread CPU (it time-shares), `busy_ms` counted busy by the metrics, and
    `input_ms` waiting for input. None: 0."""
    table_corun_slowdown: float | None = None
    """A replica's table work (memory-bound, unlike the encoder) in `corun_processes`
    processes at once against alone. None in older fits (then the encoder's)."""
    timeshare: dict | None = None
    """Ranks beyond the host's cores (`corun_processes`): how much of full time-sharing
    (every rank's CPU work waiting for all the others') their steps meet, measured at
    four times as many emulated ranks as cores (fsbench.scaling.timeshare): `efficiency` in
    [0, 1], `ranks`, and each trainer's own. None: 1 (full time-sharing)."""

    wide_ms_per_melem: float | None = None
    """A batch's wide attention buckets (samples x padded length^2 beyond
    `wide_threshold_melem` million elements) cost this much more per million elements
    (fsbench.costmodel.batch_terms). None in older fits (then 0)."""
    wide_threshold_melem: float | None = None
    batch_sample_ms: float | None = None
    """A jagged batch's cost per sample beyond cost(L) (either sign: cost(L)'s constant
    was measured at one batch size; fsbench.costmodel.batch_terms). None in older fits."""
    footprint_per_ktoken: float | None = None
    """A batch of more tokens than cost(L) was timed on runs slower per token: this
    fraction of its cost(L) per thousand tokens beyond TOKENS_PER_POINT
    (fsbench.costmodel.batch_terms). None in older fits (then 0)."""
    padded: bool | None = None
    """cost(L)'s square term is of the sample's padded length P(L) (the attention bucket's,
    `Bucketing`), as the model computes it: a P(L)^2 + b L + c. None in older fits, whose
    square term is of L (see quadratic_cost)."""
    passes: list[dict] | None = None
    """A fit calibrated in several passes (calibrate's `passes`): each pass's encoder time
    for the workload's batch and PASS_SCALARS, in the order measured. None: one pass."""

    def batch_extra_ms(self, lengths: np.ndarray) -> float:
        """What a batch of these lengths costs beyond the sum of cost(L) (0 when empty)."""
        if len(lengths) == 0:
            return 0.0
        wide = (self.wide_ms_per_melem * wide_excess(lengths, self.wide_threshold_melem or 0.0)
                if self.wide_ms_per_melem else 0.0)
        footprint = (self.footprint_per_ktoken * footprint_excess(lengths, self.cost_ms)
                     if self.footprint_per_ktoken else 0.0)
        return ((self.batch_ms or 0.0) + (self.batch_sample_ms or 0.0) * len(lengths) + footprint
                + (self.bucket_ms or 0.0) * bucket_count(lengths) + wide)

    def encoder_ms(self, lengths: np.ndarray) -> float:
        """A batch's encoder time: its samples' cost(L) and the batch terms."""
        return float(np.sum(self.cost_ms(lengths))) + self.batch_extra_ms(lengths)

    def batch_terms_text(self) -> str:
        """The batch terms in words (calibrate's output, the validation's header)."""
        return (f"{self.batch_ms or 0.0:.2f} ms + {self.batch_sample_ms or 0.0:.3f} ms per sample + "
                f"{self.bucket_ms or 0.0:.2f} ms per attention bucket + "
                f"{self.wide_ms_per_melem or 0.0:.1f} ms per million attention elements beyond "
                f"{self.wide_threshold_melem or 0.0:.2f} million in a bucket + "
                f"{100 * (self.footprint_per_ktoken or 0.0):.2f}% of cost(L) per thousand tokens beyond "
                f"{TOKENS_PER_POINT:,}")

    def cost_ms(self, lengths: np.ndarray) -> np.ndarray:
        return quadratic_cost(self.a, self.b, self.c, lengths, bool(self.padded))


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def device_key(device: str = "cpu") -> str:
    """What the fit depends on: the GPU model, or the CPU model and thread count."""
    if device == "cuda":
        return _slug(torch.cuda.get_device_name())
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1] for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return f"cpu-{_slug(cpu)}-t{torch.get_num_threads()}"


def model_key(workload: WorkloadConfig) -> str:
    m = workload.model
    if workload.compute == "synthetic":
        return f"synthetic-{workload.synthetic.us_per_token:g}us"
    rows = f"-t{m.row_dim}" if m.row_dim != m.dim else ""
    return f"{m.family}-d{m.dim}{rows}-l{m.num_layers}-h{m.num_heads}-neg{workload.negatives_per_step}"


def fit_path(out_dir: str | Path, workload: WorkloadConfig, device: str) -> Path:
    return Path(out_dir) / "calibrations" / f"{model_key(workload)}__{device_key(device)}.json"


def load_fit(out_dir: str | Path, workload: WorkloadConfig, device: str = "cpu") -> CostFit | None:
    """The stored fit for this model on this device, if one exists."""
    path = fit_path(out_dir, workload, device)
    return fit_from_dict(read_json(path)) if path.exists() else None


def fit_from_dict(raw: dict) -> CostFit:
    """A CostFit from its stored fields. Fields an older version stored and this one
    replaced are left out (their quantity is then missing: measured again where it is
    needed)."""
    known = {f.name for f in dataclasses.fields(CostFit)}
    return CostFit(**{k: v for k, v in raw.items() if k in known})


REQUIRED_FIT_FIELDS = tuple(f.name for f in dataclasses.fields(CostFit)
                            if f.default is dataclasses.MISSING)
"""What every stored fit holds (the fields without a default)."""
