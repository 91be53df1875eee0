"""Naive PyTorch DDP: what a team gets with no special effort.

Each rank takes a contiguous slice of the global batch (blind to sequence lengths), holds
a full replica of every embedding table and dense layer, and DDP all-reduces all
gradients during backward.
"""
from __future__ import annotations

from fsbench.training.dp import DataParallelTrainer
from fsbench.training.inputs import ContiguousShare
from fsbench.training.trainer import Preparer


class DDPTrainer(DataParallelTrainer):
    def make_preparer(self) -> Preparer:
        return ContiguousShare(self.source, self.ctx.rank, self.ctx.world_size)
