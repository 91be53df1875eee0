"""What the simulator (fsbench.scaling.simulate) is told: how a trainer behaves
(`SimProfile`, which a trainer class declares with `sim_profile(options, world_size)`) and
the hardware it runs on (`Cluster`; the presets in `CLUSTERS`).

Kept apart from the simulation itself so that trainers (freescale_impl) can declare their
profile without importing the simulator, and so that a preset's figures are in one place.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from fsbench.running.memory import REPLICATED, TableMemory

EXCHANGES = ("none", "blocking", "overlapped", "prioritized")


@dataclasses.dataclass(frozen=True)
class SimProfile:
    """How a trainer splits, holds tables and communicates, for the simulator."""
    tables: TableMemory = REPLICATED
    exchange: str = "none"
    """Embedding rows of sharded tables: blocking, overlapped or prioritized (EXCHANGES)."""
    sm_free: bool = False
    """The embedding exchange runs on copy engines: it slows no compute."""
    plan: Callable[[list[np.ndarray], int], list[list[np.ndarray]]] | None = None
    """costs of a window's batches, N -> per step, each rank's indices into the window's
    concatenated samples; None: each batch split contiguously (the baselines)."""
    window: int = 1
    chunks: int = 1
    """Pieces of the row exchange: the first is waited for, the rest hide under compute."""

    def __post_init__(self) -> None:
        assert self.exchange in EXCHANGES, self.exchange


@dataclasses.dataclass(frozen=True)
class Cluster:
    name: str
    description: str
    compute: str                 # "fit": the store's calibrated cost; "flops": FLOPs at mfu x peak
    gpus_per_node: int = 1
    intra_gbs: float = 0.0       # GB/s per GPU inside a node (bus bandwidth)
    inter_gbs: float = 0.0       # GB/s per GPU across nodes
    alpha_s: float = 0.0         # per-collective latency per log2(N) step
    peak_tflops: float = 0.0
    mfu: float = 0.0
    layer_overhead_ms: float = 0.0
    """Per encoder layer and step, forward + backward: kernel launches and small ops that
    no FLOP count sees (GPU presets)."""
    sm_slowdown: float = 0.0
    table_ns_per_element: float = 0.0
    """Optimizer step per table element (GPU presets; `local` takes its fit's)."""


CLUSTERS = {
    "h100": Cluster(
        "h100", "8x H100 per node, NVLink 4 (370 GB/s bus bandwidth per GPU), 400 Gb/s (50 GB/s) "
        "per GPU across nodes, 10 us per log2(N) step; encoder at 20% of 989 TFLOPS (bf16 dense) "
        "plus 0.3 ms per layer and step of launches; SM-contention slowdown 10% of overlapped "
        "compute; an optimizer step of 28 bytes per table element at 3.35 TB/s (ASSUMED figures, not yet measured on a GPU: `fsbench calibrate --device cuda` "
        "and `fsbench micro sm-contention` measure them)",
        "flops", gpus_per_node=8, intra_gbs=370.0, inter_gbs=50.0, alpha_s=10e-6,
        peak_tflops=989.0, mfu=0.20, layer_overhead_ms=0.3, sm_slowdown=0.10,
        table_ns_per_element=28 / 3.35e12 * 1e9),
    "local": Cluster(
        "local", "this machine: gloo collectives fitted by `fsbench calibrate --comm`, encoder "
        "cost from `fsbench calibrate` (CPU: no SMs to contend for)", "fit"),
}


def contiguous_plan(costs: list[np.ndarray], n: int) -> list[list[np.ndarray]]:
    from fsbench.workloads.batch import contiguous_split

    out, offset = [], 0
    for c in costs:
        out.append([np.asarray(idx, dtype=np.int64) + offset for idx in contiguous_split(c.size, n)])
        offset += c.size
    return out
