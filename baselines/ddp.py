"""Naive PyTorch DDP: what a team gets with no special effort.

Each rank takes a contiguous slice of the global batch (blind to sequence lengths), holds
a full replica of every embedding table and dense layer, and DDP all-reduces all
gradients during backward.
"""
from __future__ import annotations

from fsbench.dp import DataParallelTrainer
from fsbench.workloads.batch import JaggedBatch


class DDPTrainer(DataParallelTrainer):
    def local_samples(self, batch: JaggedBatch) -> JaggedBatch:
        return batch.contiguous_slice(self.ctx.rank, self.ctx.world_size)
