"""The dense part of a model, shared by all trainers: input assembly, encoder, loss.

    x_t  = item_t + context(sample of t) + position_t       (packed, (T, D))
    h    = LayerNorm(blocks(x))                             (T, D)
    loss = sum_t sampled_softmax(h_t) / batch.global_num_targets
(with `model.table_dim` rows narrower than D: item_t and h_t pass a projection each)

Normalizing by the GLOBAL target count (not this batch's) makes the losses of disjoint
slices of a global batch sum to the global mean loss, and their gradients sum to the
full-batch gradient, whatever the split.
"""
from __future__ import annotations

import torch
from torch import nn

from fsbench.models import dropout, emulation
from fsbench.config import ModelConfig
from fsbench.models.hstu import HSTUBlock
from fsbench.models.init import init_module_, uninitialized_embedding
from fsbench.models.jagged import Bucketing, JaggedLayout
from fsbench.models.loss import sampled_softmax_token_losses
from fsbench.models.sasrec import SASRecBlock
from fsbench.models.sparse import EmbeddingLookups
from fsbench.workloads.batch import JaggedBatch

MAX_RELATIVE_DISTANCE = 128
"""HSTU relative-position bias entries per head; longer distances share the last one."""


class DenseArch(nn.Module):
    def __init__(self, model: ModelConfig, num_contexts: int, max_seq_len: int,
                 bucketing: Bucketing = Bucketing()):
        super().__init__()
        dim, row = model.dim, model.row_dim
        # Attention padding granularity; changing it must not change any result (tested).
        self.bucketing = bucketing
        self.max_seq_len = max_seq_len
        self.context = nn.Linear((1 + num_contexts) * row, dim)
        # Rows narrower than the model: the items projected up on the way in, the hidden
        # state down to the rows' width for the loss against target and negative rows.
        self.rows_in = nn.Linear(row, dim, bias=False) if row != dim else None
        self.rows_out = nn.Linear(dim, row, bias=False) if row != dim else None
        self.positions = uninitialized_embedding(max_seq_len, dim)
        if model.family == "hstu":
            distance = min(max_seq_len, MAX_RELATIVE_DISTANCE)
            blocks = [HSTUBlock(dim, model.num_heads, distance) for _ in range(model.num_layers)]
        else:
            blocks = [SASRecBlock(dim, model.num_heads) for _ in range(model.num_layers)]
        self.blocks = nn.ModuleList(blocks)
        self.norm_out = nn.LayerNorm(dim)
        self.dropout_p = model.dropout

    def init_weights(self, seed: int) -> None:
        init_module_(self, seed, prefix="dense.")

    def layout(self, batch: JaggedBatch) -> JaggedLayout:
        if batch.batch_size and int(batch.lengths.max()) > self.max_seq_len:
            raise ValueError(f"a sample of length {int(batch.lengths.max())} exceeds "
                             f"max_seq_len={self.max_seq_len}; histories must be clipped first")
        return JaggedLayout.build(batch.lengths, self.bucketing, device=batch.item_ids.device)

    def encode(self, lookups: EmbeddingLookups, batch: JaggedBatch) -> torch.Tensor:
        """Final hidden state of every token, packed (T, D)."""
        layout = self.layout(batch)
        context = self.context(torch.cat([lookups.users, lookups.contexts.flatten(1)], dim=1))
        items = lookups.items if self.rows_in is None else self.rows_in(lookups.items)
        x = items + context.index_select(0, layout.sample) + self.positions(layout.position)
        drop = dropout.for_batch(self.dropout_p, self.training, batch, layout)
        x = drop(x, site=0)
        for i, block in enumerate(self.blocks):
            x = block(x, layout, drop, site=1 + 2 * i)
        return self.norm_out(x)

    def encode_rows(self, lookups: EmbeddingLookups, batch: JaggedBatch) -> torch.Tensor:
        """The final hidden state in the rows' width, to score against item rows."""
        hidden = self.encode(lookups, batch)
        return hidden if self.rows_out is None else self.rows_out(hidden)

    def forward(self, lookups: EmbeddingLookups, batch: JaggedBatch) -> torch.Tensor:
        """This batch's share of the global mean loss (see module docstring)."""
        if emulation.ACTIVE is not None:  # compute=emulated: wait for the modelled cost
            return emulation.ACTIVE.loss(self, lookups, batch)
        hidden = self.encode_rows(lookups, batch)
        losses = sampled_softmax_token_losses(hidden, lookups.targets, lookups.negatives,
                                              batch.targets, batch.negative_ids)
        # Target 0 (padding): a context-only position (window_targets); it has no loss.
        return losses.masked_fill(batch.targets == 0, 0.0).sum() / batch.global_num_targets
