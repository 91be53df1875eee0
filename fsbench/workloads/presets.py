"""Named, versioned workload presets. Bump `version` whenever a preset's numbers change.

tiny    CI: a 2-rank run takes seconds.
small   the CPU default: a 1- and 2-rank comparison in about a minute.
medium  one GPU node; validated and listed, not run in CI.
large   multi-node GPU scale; validated and listed, not run in CI.
hstu-e2e  NVIDIA recsys-examples' HSTU training benchmark (2 nodes of 8 H100), for the
        simulator to predict a published step (scripts/hstu_e2e.py).
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


def hstu_e2e() -> WorkloadConfig:
    """NVIDIA recsys-examples' end-to-end HSTU training benchmark
    (examples/hstu/training/benchmark/E2E_BENCHMARK.md): hidden 1024, 8 layers, 4 heads of
    256, item and user tables of 50M rows of 128, Adam at 1e-3, 32 samples a GPU on 2
    nodes of 8; histories of S items, S Zipf(1.2) on [1, 4096], each item followed by its
    action and 3 contextual tokens a sample (2 S + 3 tokens). Theirs is a ranking model
    (8 tasks' BCE); here the retrieval loss against 8 shared negatives stands in for its
    heads (a few hundred FLOPs a token against the encoder's millions)."""
    return WorkloadConfig(
        name="hstu-e2e", version=1,
        model=ModelConfig(family="hstu", dim=1024, num_layers=8, num_heads=4, table_dim=128),
        item_vocab=50_000_000, user_vocab=50_000_000, context_vocabs=(),
        max_seq_len=2 * 4_096 + 3, global_batch_size=512, steps=20, warmup=5,
        lengths="powerlaw:alpha=1.2,xmin=1,scale=2,shift=3", num_negatives=8,
        optimizer="adam", lr=0.001,
    )


WORKLOADS: dict[str, Callable[[], WorkloadConfig]] = {
    "tiny": tiny, "small": small, "medium": medium, "large": large, "comm-heavy": comm_heavy,
    "hstu-e2e": hstu_e2e,
}


def get_workload(name: str) -> WorkloadConfig:
    if name not in WORKLOADS:
        raise ConfigError(f"workload={name!r} is unknown; choose one of: {', '.join(WORKLOADS)}")
    return WORKLOADS[name]()
