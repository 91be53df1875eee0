"""Named, versioned workload presets. Bump `version` whenever a preset's numbers change.

tiny    CI: a 2-rank run takes seconds.
small   the CPU default: a 1- and 2-rank comparison in about a minute.
medium  one GPU node; validated and listed, not run in CI.
large   multi-node GPU scale; validated and listed, not run in CI.
comm-heavy  wide embeddings (dim 128), twelve context features, short histories and
        many shared negatives: little compute per sample against a lot of embedding
        traffic, so communication dominates at 2 CPU ranks (DDP all-reduces 37 MB of
        replicated table gradients per step; sharded tables move only the rows a
        step reads).

tiny and small train with Adagrad (v2): the optimizer recsys teams use for embeddings,
and one that every trainer can run on CPU (fbgemm 1.8 has no CPU fused Adam, so TorchRec
cannot train its tables with Adam there). medium and large train with Adagrad since v2 as
well: TorchRec's fused tables update only the rows a step reads, which equals the
replicated dense update for Adagrad and SGD but not for Adam. (FreeScale's sharded tables
run every table optimizer exactly, dense Adam included: `--set optimizer.tables=adam`.)
"""
from __future__ import annotations

from typing import Callable

from fsbench.config import ModelConfig, WorkloadConfig
from fsbench.errors import ConfigError


def tiny() -> WorkloadConfig:
    return WorkloadConfig(
        name="tiny", version=2,
        model=ModelConfig(family="hstu", dim=16, num_layers=1, num_heads=2),
        item_vocab=1_000, user_vocab=100, context_vocabs=(10, 5),
        max_seq_len=32, global_batch_size=8, steps=4, warmup=1,
        lengths="amazon-beauty", num_negatives=16,
        optimizer="adagrad", lr=0.01,
    )


def small() -> WorkloadConfig:
    return WorkloadConfig(
        name="small", version=2,
        model=ModelConfig(family="hstu", dim=64, num_layers=2, num_heads=2),
        item_vocab=20_000, user_vocab=5_000, context_vocabs=(100, 20, 10),
        max_seq_len=200, global_batch_size=128, steps=30, warmup=5,
        # MovieLens-100K lengths (median 65, p90 244, clipped at 200): heterogeneous enough
        # that a contiguous split leaves visible stragglers at 2 ranks.
        lengths="movielens-100k", num_negatives=64,
        optimizer="adagrad", lr=0.01,
    )


def medium() -> WorkloadConfig:
    return WorkloadConfig(
        name="medium", version=2,
        model=ModelConfig(family="hstu", dim=256, num_layers=4, num_heads=4),
        item_vocab=1_000_000, user_vocab=1_000_000, context_vocabs=(1_000, 100, 50),
        max_seq_len=1_024, global_batch_size=2_048, steps=50, warmup=10,
        lengths="movielens-1m", num_negatives=512,
        optimizer="adagrad", lr=0.01,
    )


def large() -> WorkloadConfig:
    return WorkloadConfig(
        name="large", version=2,
        model=ModelConfig(family="hstu", dim=512, num_layers=8, num_heads=8),
        item_vocab=10_000_000, user_vocab=10_000_000, context_vocabs=(10_000, 1_000, 100),
        max_seq_len=4_096, global_batch_size=8_192, steps=50, warmup=10,
        lengths="kuairand-1k", num_negatives=1_024,
        optimizer="adagrad", lr=0.01,
    )


def comm_heavy() -> WorkloadConfig:
    return WorkloadConfig(
        name="comm-heavy", version=1,
        model=ModelConfig(family="hstu", dim=128, num_layers=1, num_heads=2),
        item_vocab=50_000, user_vocab=10_000, context_vocabs=(1_000,) * 12,
        max_seq_len=64, global_batch_size=64, steps=20, warmup=4,
        lengths="amazon-beauty", num_negatives=256,
        optimizer="adagrad", lr=0.01,
    )


WORKLOADS: dict[str, Callable[[], WorkloadConfig]] = {
    "tiny": tiny, "small": small, "medium": medium, "large": large, "comm-heavy": comm_heavy,
}


def get_workload(name: str) -> WorkloadConfig:
    if name not in WORKLOADS:
        raise ConfigError(f"workload={name!r} is unknown; choose one of: {', '.join(WORKLOADS)}")
    return WORKLOADS[name]()
