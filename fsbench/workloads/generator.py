"""Synthetic global batches: a pure function of (seed, step).

Every rank builds the same global batch for step k on its own and takes its share, so
no data is sent between ranks and a trainer's choice of split cannot change what the
batch contains. That only holds if nothing is carried between calls: each batch gets a
fresh generator seeded from (seed, step).
"""
from __future__ import annotations

import numpy as np
import torch

from fsbench.config import WorkloadConfig
from fsbench.errors import ConfigError
from fsbench.workloads.batch import JaggedBatch
from fsbench.workloads.distributions import parse_length_spec
from fsbench.workloads.popularity import parse_popularity_spec


def step_rng(seed: int, step: int) -> np.random.Generator:
    """The generator for one step's batch; identical in every process."""
    if seed < 0 or step < 0:
        raise ConfigError(f"seed={seed} and step={step} must both be >= 0")
    return np.random.default_rng(np.random.SeedSequence([seed, step]))


def next_item_split(seqs: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Split packed sequences of lengths+1 items into (inputs, targets) of `lengths`
    items each: inputs drop each sequence's last item, targets its first."""
    ends = np.cumsum(lengths + 1)
    starts = ends - (lengths + 1)
    keep_input = np.ones(len(seqs), dtype=bool)
    keep_input[ends - 1] = False
    keep_target = np.ones(len(seqs), dtype=bool)
    keep_target[starts] = False
    return seqs[keep_input], seqs[keep_target]


def uniform_ids(rng: np.random.Generator, n: int, vocab: int) -> np.ndarray:
    """n ids uniform in [1, vocab-1] (0 is padding)."""
    return rng.integers(1, vocab, n, dtype=np.int64)


class SyntheticBatches:
    """Histories with lengths from `workload.lengths` and items from
    `workload.popularity`, each sample's targets its inputs shifted by one."""

    def __init__(self, workload: WorkloadConfig, seed: int) -> None:
        self.workload = workload
        self.seed = seed
        self.lengths = parse_length_spec(workload.lengths)
        self.popularity = parse_popularity_spec(workload.popularity)

    def global_batch(self, step: int) -> JaggedBatch:
        w = self.workload
        rng = step_rng(self.seed, step)
        # Hazard: the draw order below is part of the batch's definition; reordering
        # changes every stored batch for the same seed.
        lengths = self.lengths.sample(rng, w.global_batch_size, w.max_seq_len)
        seqs = self.popularity.sample(rng, int(lengths.sum()) + len(lengths), w.item_vocab)
        item_ids, targets = next_item_split(seqs, lengths)
        user_ids = uniform_ids(rng, w.global_batch_size, w.user_vocab)
        context = np.empty((w.global_batch_size, len(w.context_vocabs)), dtype=np.int64)
        for c, vocab in enumerate(w.context_vocabs):
            context[:, c] = uniform_ids(rng, w.global_batch_size, vocab)
        # model.loss=full: every item is a negative (the softmax over all items).
        negatives = (np.arange(1, w.item_vocab, dtype=np.int64) if w.model.loss == "full"
                     else self.popularity.sample(rng, w.num_negatives, w.item_vocab))
        return JaggedBatch(
            item_ids=torch.from_numpy(item_ids),
            targets=torch.from_numpy(targets),
            lengths=torch.from_numpy(lengths),
            user_ids=torch.from_numpy(user_ids),
            context_ids=torch.from_numpy(context),
            negative_ids=torch.from_numpy(negatives),
            global_num_targets=int(lengths.sum()),
            step=step,
        )
