"""What the simulator (fsbench.scaling.simulate) is told: how a trainer behaves
(`SimProfile`, which a trainer class declares with `sim_profile(options, world_size)`) and
the hardware it runs on (`Cluster`; the presets in `CLUSTERS`).

Kept apart from the simulation itself so that trainers (freescale_impl) can declare their
profile without importing the simulator, and so that a preset's figures are in one place.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Callable

import numpy as np

from fsbench.errors import ConfigError
from fsbench.training.step_program import Bucket, StepProgram, ddp_program
from fsbench.training.table_memory import REPLICATED, TableMemory

EXCHANGES = ("none", "blocking", "overlapped", "prioritized")


@dataclasses.dataclass(frozen=True)
class SimProfile:
    """How a trainer splits, holds tables and communicates, for the simulator."""
    tables: TableMemory = REPLICATED
    exchange: str = "none"
    """Embedding rows of sharded tables: blocking, overlapped or prioritized (EXCHANGES)."""
    sm_free: bool = False
    """The embedding exchange runs on copy engines: it slows no compute."""
    plan: Callable[[list[np.ndarray], int, "PlanInputs"], tuple[list[list[np.ndarray]], float]] | None = None
    """lengths of a window's batches, N, what a planner may know -> (per step, each rank's
    indices into the window's concatenated samples; the CPU ms the trainer's input stage
    spends planning the window); None: each batch split contiguously (the baselines,
    which plan nothing). A planner predicts costs as the trainer would (its own cost
    model), while the simulator books the cluster's costs: prediction error is residual
    straggler."""
    route: Callable[[object, int, int, "PlanInputs", float, int], object] | None = None
    """(workload, N, seed, what a planner may know, the global batch's expected tokens,
    the row exchange's chunks) ->
    the input stage's CPU per step beyond planning, timed on this machine: an object with
    `route_ms` (the loader worker's: reading the rank's samples and routing them),
    `prep_ms` (the rank thread's exchange preparation) and `extrapolated` (followed on a
    line from smaller batches); None: the input stage routes nothing (the baselines;
    FreeScale with replicated tables)."""
    sample_exchange: bool = False
    """`data=sharded`: each rank holds one shard of the global batch; the lengths are
    all-gathered and the planned samples exchanged in the step (blocking), and the plan
    and the request are made on the rank's thread (freescale_impl.sample_exchange)."""
    window: int = 1
    chunks: int = 1
    """Pieces of the row exchange, each an all-to-all of its own (its own latency); 0: the
    count the trainer's rule gives on the simulated cluster (fsbench.scaling.chunking)."""
    growths: tuple[float, ...] = (1.0,)
    """The cuts the chunk rule may choose among (each sub-batch's tokens against the one
    before's); an asked cut: that one alone."""
    program: Callable[[list[Bucket], int, int, object, float, bool, str], StepProgram] = (
        lambda buckets, gpus_per_node, chunks, workload=None, growth=1.0, gpu=False, route="": ddp_program(buckets))
    """(DDP's buckets, GPUs a node, the row exchange's chunks as chosen, the workload as
    simulated: how a trainer cuts its step may follow the data, each sub-batch's tokens
    against the one before's as chosen, whether the ranks are GPUs: a host that waits
    runs otherwise than a stream that does, the route chosen among `routes`) -> the trainer's
    step as ops (fsbench.training.step_program): every collective it issues and waits for,
    in its order, and its host syncs. The simulator costs exactly these
    (fsbench.scaling.step_engine)."""
    nodes_sm_share: float = 1.0
    """Of what NCCL's kernels take from overlapped compute, the share an exchange between
    nodes takes with its CTAs capped (FreeScale's sm_free beyond one node: comm_ctas)."""
    routes: tuple[str, ...] = ("",)
    """The routes of its exchanges the chunk rule chooses among with the count
    (fsbench.scaling.chunk_replay.StepEstimate.routes; FreeScale's a2a=auto)."""
    ranks_a_node: int = 0
    """Ranks a node as the trainer was told (FreeScale's node_ranks), over the cluster's
    GPUs a node (0: the cluster's; on `local`, every rank on one host)."""

    def __post_init__(self) -> None:
        assert self.exchange in EXCHANGES, self.exchange


@dataclasses.dataclass(frozen=True)
class PlanInputs:
    """What a trainer's planner sees when the simulator asks for its plan: the workload,
    the store its calibrated fits would come from, and the device it would run on."""
    workload: object  # fsbench.config.WorkloadConfig
    store: str | Path | None
    """Where its calibrated fits would be; None: none could be (a GPU preset's GPUs)."""
    device: str
    fit: object = None
    """A CostFit the trainer there would find (a GPU cluster's encoder fit); None: the
    store's, if any."""


# A GPU cluster's figures: field -> (unit, what it is). Every simulated output names those
# that are assumed rather than measured (`assumptions`).
FIGURES: dict[str, tuple[str, str]] = {
    "gpus_per_node": ("", "GPUs per node"),
    "intra_gbs": ("GB/s", "bus bandwidth per GPU inside a node (NVLink)"),
    "nvls_gbs": ("GB/s", "all-reduce bus bandwidth inside a node with NVLink SHARP (0: none)"),
    "inter_gbs": ("GB/s", "one NIC's bandwidth per GPU across nodes (an all-to-all's limit)"),
    "nic_share": ("", "share of a node's NICs' bandwidth that all-reduce, all-gather and reduce-scatter reach across nodes"),
    "alpha_s": ("s", "collective latency per log2(N) step"),
    "ring_peer_s": ("s", "a ring collective's fixed cost per rank across nodes (messages of 32 MiB and more)"),
    "a2a_peer_s": ("s", "an all-to-all's fixed cost per peer"),
    "peak_tflops": ("TFLOPS", "encoder peak"),
    "mfu": ("", "share of peak the encoder reaches"),
    "layer_overhead_ms": ("ms", "launches per encoder layer and pass"),
    "sm_slowdown": ("", "compute slowdown beside SM-based communication"),
    "host_sync_s": ("s", "the device's wait per host sync inside a step (the host relaunches)"),
    "table_ns_per_element": ("ns", "optimizer step per table element"),
    "input_workers": ("", "loader worker processes per GPU, each preparing whole steps"),
    "host_cpu_speed": ("", "a host core's speed against this machine's (the input stage is timed here)"),
}
WHOLE_FIGURES = ("gpus_per_node", "input_workers")
"""Figures that are counts: integers >= 1."""
DIVISORS = ("intra_gbs", "inter_gbs", "nic_share", "peak_tflops", "host_cpu_speed")
"""Rates the simulator divides bytes, FLOPs or CPU time by: a cluster must give them > 0."""
FIT_REPLACES = ("peak_tflops", "mfu", "layer_overhead_ms")
"""The figures a measured encoder fit (`Cluster.encoder_fit`) stands in for: its cost per
sample and per batch replace FLOPs at mfu x peak and the per-layer launches. It replaces
table_ns_per_element too where it measured the optimizer."""


@dataclasses.dataclass(frozen=True)
class Cluster:
    name: str
    description: str
    compute: str                 # "fit": the store's calibrated cost; "flops": FLOPs at mfu x peak
    gpus_per_node: int = 1
    # How collectives are priced: fsbench.scaling.collectives (its docstring has the model)
    intra_gbs: float = 0.0       # GB/s bus bandwidth per GPU inside a node
    nvls_gbs: float = 0.0        # GB/s all-reduce bus bandwidth in a node with NVLink SHARP
    inter_gbs: float = 0.0       # GB/s of one NIC per GPU across nodes
    nic_share: float = 1.0       # ring collectives across nodes: G x inter_gbs x nic_share
    alpha_s: float = 0.0         # per-collective latency per log2(N) step
    ring_peer_s: float = 0.0     # a ring's fixed cost per rank across nodes
    a2a_peer_s: float = 0.0      # an all-to-all's fixed cost per peer
    peak_tflops: float = 0.0
    mfu: float = 0.0
    layer_overhead_ms: float = 0.0
    """Per encoder layer and step, forward + backward: kernel launches and small ops that
    no FLOP count sees (GPU presets)."""
    sm_slowdown: float = 0.0
    host_sync_s: float = 0.0
    """A GPU's idle per host sync inside a step: the launch queue drained, the host issues
    the next kernels (GPU presets; `local` measures its overhead instead)."""
    table_ns_per_element: float = 0.0
    """Optimizer step per table element (GPU presets; `local` takes its fit's)."""
    input_workers: int = 1
    """Loader workers per rank, preparing different steps (a window's at once): a stage of
    S ms of CPU a step keeps up with steps of S / input_workers ms (`local`: the run's one)."""
    host_cpu_speed: float = 1.0
    """A host core's speed against this machine's, on which the input stage is timed: the
    stage there takes its time here / host_cpu_speed (`local`: this machine, 1)."""
    assumed: tuple[str, ...] = ()
    """The FIGURES whose values are assumptions, not measurements (a `fit` cluster measures
    its costs on this machine and has none)."""
    source: str = "preset"
    """Where it came from: "preset", a cluster file's path; "+ --cluster-set K" per override."""
    encoder_fit: str | None = None
    """A GPU cluster's measured encoder: the path of a `fsbench calibrate --device cuda`
    fit (with_encoder_fit), whose costs the simulator books instead of the FIT_REPLACES
    figures; None: those figures."""
    replaced: tuple[str, ...] = ()
    """The FIGURES the encoder fit replaces (unused, neither assumed nor measured)."""

    def __post_init__(self) -> None:
        if self.compute not in ("fit", "flops"):
            raise ConfigError(f"cluster {self.name!r}: compute={self.compute!r}; allowed: fit, flops")
        unknown = sorted(set(self.assumed) - set(FIGURES))
        if unknown:
            raise ConfigError(f"cluster {self.name!r}: assumed names unknown figures {unknown}; "
                              f"figures: {', '.join(FIGURES)}")


def _figure(name: str, value: float) -> str:
    unit = FIGURES[name][0]
    return f"{name}={value:g}" + (f" {unit}" if unit else "")


def assumptions(cluster: Cluster) -> str:
    """One line that every simulated output carries: the cluster, where its figures came
    from, and which are ASSUMED (not measured)."""
    if cluster.compute == "fit":
        return (f"{cluster.name}: costs measured on this machine (fsbench calibrate fits: encoder, "
                f"tables, collectives, per-step overhead, time-sharing beyond the cores); nothing assumed")
    assumed = [_figure(f, getattr(cluster, f)) for f in FIGURES if f in cluster.assumed]
    given = [_figure(f, getattr(cluster, f)) for f in FIGURES
             if f not in cluster.assumed and f not in cluster.replaced]
    return (f"{cluster.name} ({cluster.source}): ASSUMED " + (", ".join(assumed) or "nothing")
            + (f"; measured {', '.join(given)}" if given else "")
            + (f"; encoder measured: the fit {cluster.encoder_fit} (in place of "
               f"{', '.join(cluster.replaced)})" if cluster.encoder_fit else ""))


def assumption_record(cluster: Cluster) -> dict:
    """The same, structured (JSON outputs): every figure, which are assumed, and the
    encoder fit with the figures it replaces."""
    return {"cluster": cluster.name, "source": cluster.source, "compute": cluster.compute,
            "figures": {f: getattr(cluster, f) for f in FIGURES if f not in cluster.replaced},
            "assumed": [f for f in FIGURES if f in cluster.assumed],
            "encoder_fit": cluster.encoder_fit, "replaced_by_fit": list(cluster.replaced),
            "line": assumptions(cluster)}


def read_encoder_fit(path: str | Path, where: str = "--cluster-fit"):
    """The CostFit stored at `path` (a `fsbench calibrate` fit file), or a one-line error
    that starts with `where` (the option or file that named it)."""
    from fsbench.costmodel.fit import REQUIRED_FIT_FIELDS, fit_from_dict

    where = f"{where} {path}"
    raw = _read_table(Path(path), where)
    missing = sorted(set(REQUIRED_FIT_FIELDS) - set(raw))
    if missing:
        raise ConfigError(f"{where}: not a fsbench calibrate fit (lacks {', '.join(missing)})")
    return fit_from_dict(raw)


def _read_table(path: Path, where: str) -> dict:
    """A .toml or JSON file's table of keys, or a one-line error that starts with `where`."""
    try:
        if path.suffix == ".toml":
            import tomllib

            raw = tomllib.loads(path.read_text())
        else:
            raw = json.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"{where}: cannot read it ({e.strerror})") from None
    except ValueError as e:
        raise ConfigError(f"{where}: not valid {'TOML' if path.suffix == '.toml' else 'JSON'} ({e})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a table of keys, got {type(raw).__name__}")
    return raw


def with_encoder_fit(cluster: Cluster, path: str | Path, where: str = "--cluster-fit") -> Cluster:
    """`cluster` booking the encoder (and the optimizer, where measured) from the fit at
    `path`: the figures it replaces leave the assumptions."""
    if cluster.compute == "fit":
        raise ConfigError(f"{where}: cluster {cluster.name!r} takes every cost from this "
                          "machine's fits already; give a fit to a GPU preset or cluster file")
    fit = read_encoder_fit(path, where)
    replaced = FIT_REPLACES + (("table_ns_per_element",) if fit.table_ns_per_element is not None else ())
    return dataclasses.replace(cluster, encoder_fit=str(path), replaced=replaced,
                               assumed=tuple(f for f in cluster.assumed if f not in replaced),
                               source=f"{cluster.source} + --cluster-fit")


def _h100() -> Cluster:
    """The h100 preset: its collectives fitted on published nccl-tests results of H100
    clusters (fsbench/scaling/data/h100_nccl_tests.json, each source with its address,
    date, NCCL version and topology; results/cluster_h100_nccl_tests.md holds the fit
    against held-out logs), its compute, launches, SM contention, optimizer and input
    workers still assumed."""
    from fsbench.scaling.collectives import published_figures

    figures, _, sources = published_figures()
    return Cluster(
        "h100", "8x H100 SXM per node, NVLink 4 + NVSwitch, a 400 Gb/s InfiniBand NIC per GPU: "
        f"collectives MEASURED (fitted on {len(sources)} published nccl-tests results: "
        f"NVLink {figures['intra_gbs']:.0f} GB/s, NVLS all-reduce {figures['nvls_gbs']:.0f} GB/s, "
        f"a NIC {figures['inter_gbs']:.1f} GB/s, ring collectives across nodes at "
        f"{figures['nic_share']:.2f} of a node's NICs, latency {figures['alpha_s'] * 1e6:.1f} us per log2(N) "
        f"step, {figures['ring_peer_s'] * 1e6:.1f} us per rank of a ring across nodes, "
        f"{figures['a2a_peer_s'] * 1e6:.1f} us per all-to-all peer); ASSUMED, not yet measured on a GPU "
        "(`fsbench calibrate --device cuda` and `fsbench micro sm-contention` measure them; "
        "`fsbench micro input-stage` on the host times its cores): encoder at 20% of 989 TFLOPS "
        "(bf16 dense), 0.3 ms of launches per layer and pass (a pass takes the longer of its kernels "
        "and its launches, the gap idle), SM-contention slowdown 10% of "
        "overlapped compute, 30 us of device idle per host sync in a step, an optimizer step of 28 "
        "bytes per table element at 3.35 TB/s, 4 loader "
        "workers per GPU on host cores as fast as this machine's",
        "flops", **{k: (int(v) if k in WHOLE_FIGURES else v) for k, v in figures.items()},
        peak_tflops=989.0, mfu=0.20, layer_overhead_ms=0.3, sm_slowdown=0.10, host_sync_s=30e-6,
        table_ns_per_element=28 / 3.35e12 * 1e9, input_workers=4, host_cpu_speed=1.0,
        assumed=tuple(f for f in FIGURES if f not in figures))


CLUSTERS = {
    "h100": _h100(),
    "local": Cluster(
        "local", "this machine: gloo collectives fitted by `fsbench calibrate --comm`, encoder "
        "cost from `fsbench calibrate` (CPU: no SMs to contend for)", "fit"),
}


def _number(field_name: str, value, where: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {field_name}={value!r} is not a number") from None
    if not math.isfinite(number):
        raise ConfigError(f"{where}: {field_name}={value!r} must be a finite number")
    if field_name in WHOLE_FIGURES:
        if number < 1 or number != int(number):
            raise ConfigError(f"{where}: {field_name}={value!r} must be an integer >= 1")
        return int(number)
    if field_name == "mfu" and not 0 < number <= 1:
        raise ConfigError(f"{where}: mfu={value!r} must be in (0, 1]")
    if field_name in DIVISORS and number <= 0:
        raise ConfigError(f"{where}: {field_name}={value!r} must be > 0 (a time divides by it)")
    if number < 0:
        raise ConfigError(f"{where}: {field_name}={value!r} must be >= 0")
    return number


def read_cluster_file(path: str | Path) -> Cluster:
    """A cluster a user wrote: a .toml or .json file with `name`, `description`, the
    FIGURES it sets (compute is "flops"), and optionally `measured`: the figures it
    measured, and `encoder_fit`: a `fsbench calibrate --device cuda` fit's path (relative
    to the file), whose costs replace FIT_REPLACES. Every other figure it sets counts as
    assumed."""
    path = Path(path)
    where = f"--cluster {path}"
    raw = _read_table(path, where)
    allowed = {"name", "description", "measured", "encoder_fit", *FIGURES}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown}; allowed: {', '.join(sorted(allowed))}")
    figures = {k: _number(k, v, where) for k, v in raw.items() if k in FIGURES}
    measured = raw.get("measured", [])
    if not isinstance(measured, list) or not set(measured) <= set(figures):
        raise ConfigError(f"{where}: measured={measured!r} must list figures the file sets: "
                          f"{', '.join(figures) or 'none'}")
    cluster = Cluster(str(raw.get("name", path.stem)), str(raw.get("description", f"from {path}")),
                      "flops", **figures, assumed=tuple(f for f in FIGURES if f not in measured),
                      source=str(path))
    if "encoder_fit" not in raw:
        return cluster
    # a fit named in the file: relative to the file, and the file stays the source
    fit = path.parent / str(raw["encoder_fit"])
    return dataclasses.replace(with_encoder_fit(cluster, fit, f"--cluster {path}: encoder_fit"),
                               source=str(path))


def load_cluster(spec: str, overrides: list[str] = (), encoder_fit: str | None = None) -> Cluster:
    """A preset by name (CLUSTERS) or a cluster file (a path), then `--cluster-set
    FIGURE=VALUE` overrides: a figure set on the command line is an assumption; then a
    measured encoder fit (`--cluster-fit`, with_encoder_fit)."""
    cluster = _with_overrides(spec, overrides)
    return with_encoder_fit(cluster, encoder_fit) if encoder_fit else cluster


def _with_overrides(spec: str, overrides: list[str]) -> Cluster:
    if spec in CLUSTERS:
        cluster = CLUSTERS[spec]
    elif Path(spec).suffix in (".toml", ".json"):
        cluster = read_cluster_file(spec)
    else:
        raise ConfigError(f"--cluster {spec!r}: not a preset ({', '.join(CLUSTERS)}) nor a "
                          f".toml or .json cluster file")
    changed = {}
    for item in overrides:
        key, eq, value = item.partition("=")
        if not eq or key not in FIGURES:
            raise ConfigError(f"--cluster-set {item!r}: expected FIGURE=VALUE with FIGURE one of: "
                              f"{', '.join(FIGURES)}")
        changed[key] = _number(key, value, f"--cluster-set {item}")
    if changed and cluster.compute == "fit":
        raise ConfigError(f"--cluster-set: cluster {cluster.name!r} takes its costs from this "
                          "machine's fits, not from figures; set figures on a GPU preset or file")
    if not changed:
        return cluster
    return dataclasses.replace(cluster, **changed, assumed=tuple(f for f in FIGURES if f in cluster.assumed or f in changed),
                               source=f"{cluster.source} + --cluster-set {','.join(changed)}")


def contiguous_plan(lengths: list[np.ndarray], n: int, inputs: PlanInputs | None = None
                    ) -> tuple[list[list[np.ndarray]], float]:
    """Each batch split into N contiguous pieces: the baselines' split, planned by nobody
    (0 ms of planning)."""
    from fsbench.workloads.batch import contiguous_split

    out, offset = [], 0
    for c in lengths:
        out.append([np.asarray(idx, dtype=np.int64) + offset for idx in contiguous_split(c.size, n)])
        offset += c.size
    return out, 0.0
