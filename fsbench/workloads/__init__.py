"""Workloads: what a global batch contains at each step, synthetic or from real data.

The members below import numpy and torch, so they are loaded on first use (PEP 562
`__getattr__`): importing `fsbench.workloads.presets` to build a config stays light, while
`from fsbench.workloads import make_batch_source, JaggedBatch, ...` works as before.

May import: the top-level leaves and measurement only.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from fsbench.specs import parse_data

if TYPE_CHECKING:
    from fsbench.config import WorkloadConfig
    from fsbench.workloads.batch import JaggedBatch, contiguous_split
    from fsbench.workloads.distributions import (
        LENGTH_PRESETS,
        FixedLength,
        HistogramLength,
        LengthDistribution,
        LengthPreset,
        LogNormalLength,
        PowerLawLength,
        UniformLength,
        parse_length_spec,
    )
    from fsbench.workloads.generator import SyntheticBatches
    from fsbench.workloads.popularity import ZipfPopularity, parse_popularity_spec
    from fsbench.workloads.realdata import (
        DataSpec,
        Histories,
        RealDataBatches,
        load_histories,
        parse_data_spec,
    )

_LAZY = {  # public name -> the submodule that defines it
    "JaggedBatch": "batch", "contiguous_split": "batch",
    "LENGTH_PRESETS": "distributions", "FixedLength": "distributions",
    "HistogramLength": "distributions", "LengthDistribution": "distributions",
    "LengthPreset": "distributions", "LogNormalLength": "distributions",
    "PowerLawLength": "distributions", "UniformLength": "distributions",
    "parse_length_spec": "distributions",
    "ZipfPopularity": "popularity", "parse_popularity_spec": "popularity",
    "SyntheticBatches": "generator",
    "DataSpec": "realdata", "Histories": "realdata", "RealDataBatches": "realdata",
    "load_histories": "realdata", "parse_data_spec": "realdata",
}


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def make_batch_source(workload: WorkloadConfig, seed: int,
                      held_out: int = 0) -> SyntheticBatches | RealDataBatches:
    """The batch source `workload.data` names; both have `global_batch(step)`.
    `held_out` (real data only, a run with evaluation on): train without each user's
    last `held_out` items, which `fsbench.training.evaluate` validates and tests on."""
    from fsbench.workloads.generator import SyntheticBatches
    from fsbench.workloads.realdata import RealDataBatches, load_histories

    spec = parse_data(workload.data)
    if spec.kind == "synthetic":
        if held_out:
            raise ValueError("held-out items need real data (data=sasrec|recbole|otto:PATH)")
        return SyntheticBatches(workload, seed)
    return RealDataBatches(workload, seed, load_histories(spec), held_out=held_out)


__all__ = [
    "LENGTH_PRESETS", "DataSpec", "FixedLength", "Histories", "HistogramLength",
    "JaggedBatch", "LengthDistribution", "LengthPreset", "LogNormalLength",
    "PowerLawLength", "RealDataBatches", "SyntheticBatches", "UniformLength",
    "ZipfPopularity", "contiguous_split", "load_histories", "make_batch_source",
    "parse_data_spec", "parse_length_spec", "parse_popularity_spec",
]
