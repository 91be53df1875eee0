"""Workloads: what a global batch contains at each step, synthetic or from real data."""
from __future__ import annotations

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
from fsbench.workloads.popularity import ZipfPopularity, parse_popularity_spec
from fsbench.workloads.generator import SyntheticBatches
from fsbench.workloads.realdata import (
    DataSpec,
    Histories,
    RealDataBatches,
    load_histories,
    parse_data_spec,
)


def make_batch_source(workload: WorkloadConfig, seed: int) -> SyntheticBatches | RealDataBatches:
    """The batch source `workload.data` names; both have `global_batch(step)`."""
    spec = parse_data_spec(workload.data)
    if spec.kind == "synthetic":
        return SyntheticBatches(workload, seed)
    return RealDataBatches(workload, seed, load_histories(spec))


__all__ = [
    "LENGTH_PRESETS", "DataSpec", "FixedLength", "Histories", "HistogramLength",
    "JaggedBatch", "LengthDistribution", "LengthPreset", "LogNormalLength",
    "PowerLawLength", "RealDataBatches", "SyntheticBatches", "UniformLength",
    "ZipfPopularity", "contiguous_split", "load_histories", "make_batch_source",
    "parse_data_spec", "parse_length_spec", "parse_popularity_spec",
]
