"""The reference model rebuilt from TorchRec modules, and the batch type its pipeline moves.

Same function as `fsbench.models.RecModel`, with the tables held by TorchRec collections:

    sequence  EmbeddingCollection, one table `item` read by three jagged features
              item_input (inputs), item_target (next items) and item_negative (the
              shared negatives): tied, as in `SparseArch`
    pooled    EmbeddingBagCollection, `user` and `context_<i>`, one id per sample each;
              sum pooling of a single id is that row, exactly (row-wise sharding adds
              the owner's row to the other ranks' zeros, also exact)
    dense     the shared `DenseArch`, fed by `assemble_lookups`, so the same rows reach
              the same dense code as in every other trainer

The negatives are shared by the whole batch, but a KeyedJaggedTensor needs the same
number of bags per feature: the K negatives form the first sample's bag of
`item_negative`, every other sample's bag is empty.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torchrec.modules.embedding_configs import (
    EmbeddingBagConfig,
    EmbeddingConfig,
    PoolingType,
)
from torchrec.modules.embedding_modules import (
    EmbeddingBagCollection,
    EmbeddingCollection,
)
from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor, KeyedTensor
from torchrec.streamable import Pipelineable

from fsbench.models import DenseArch, TableSpec, assemble_lookups
from fsbench.models.sparse import ITEM, USER, context_table
from fsbench.workloads.batch import JaggedBatch

ITEM_INPUT, ITEM_TARGET, ITEM_NEGATIVE = "item_input", "item_target", "item_negative"
SEQUENCE_FEATURES = (ITEM_INPUT, ITEM_TARGET, ITEM_NEGATIVE)


def pooled_features(num_contexts: int) -> list[str]:
    """Feature names of the pooled KJT; each feature reads the table of the same name."""
    return [USER] + [context_table(i) for i in range(num_contexts)]


@dataclass
class TorchRecBatch(Pipelineable):
    """One rank's share of a global batch, as TorchRec's pipelines move it: two KJTs for the
    sharded collections plus the plain tensors the dense part needs."""

    sequence: KeyedJaggedTensor  # item_input, item_target, item_negative
    pooled: KeyedJaggedTensor  # user, context_0, ...
    lengths: torch.Tensor  # (B,)
    item_ids: torch.Tensor  # (T,)
    targets: torch.Tensor  # (T,)
    user_ids: torch.Tensor  # (B,)
    context_ids: torch.Tensor  # (B, C)
    negative_ids: torch.Tensor  # (K,)
    global_num_targets: int
    step: int

    @classmethod
    def from_jagged(cls, b: JaggedBatch) -> TorchRecBatch:
        if b.batch_size == 0:
            raise ValueError("a rank got no samples; TorchRec needs at least one per rank")
        k = b.negative_ids.shape[0]
        negative_lengths = torch.zeros_like(b.lengths)
        negative_lengths[0] = k
        sequence = KeyedJaggedTensor.from_lengths_sync(
            keys=list(SEQUENCE_FEATURES),
            values=torch.cat([b.item_ids, b.targets, b.negative_ids]),
            lengths=torch.cat([b.lengths, b.lengths, negative_lengths]),
        )
        num_contexts = b.context_ids.shape[1]
        pooled = KeyedJaggedTensor.from_lengths_sync(
            keys=pooled_features(num_contexts),
            # feature-major: all users, then context_0 of every sample, ...
            values=torch.cat([b.user_ids, b.context_ids.t().reshape(-1)]),
            lengths=torch.ones(b.batch_size * (1 + num_contexts), dtype=torch.int64),
        )
        return cls(sequence=sequence, pooled=pooled, lengths=b.lengths, item_ids=b.item_ids,
                   targets=b.targets, user_ids=b.user_ids, context_ids=b.context_ids,
                   negative_ids=b.negative_ids, global_num_targets=b.global_num_targets,
                   step=b.step)

    def jagged(self) -> JaggedBatch:
        """The dense view the shared `DenseArch` reads."""
        return JaggedBatch(item_ids=self.item_ids, targets=self.targets, lengths=self.lengths,
                           user_ids=self.user_ids, context_ids=self.context_ids,
                           negative_ids=self.negative_ids,
                           global_num_targets=self.global_num_targets, step=self.step)

    def _tensors(self) -> list:
        return [self.sequence, self.pooled, self.lengths, self.item_ids, self.targets,
                self.user_ids, self.context_ids, self.negative_ids]

    def to(self, device: torch.device, non_blocking: bool = False) -> TorchRecBatch:
        moved = [t.to(device=device, non_blocking=non_blocking) for t in self._tensors()]
        return TorchRecBatch(*moved, global_num_targets=self.global_num_targets, step=self.step)

    def record_stream(self, stream: torch.Stream) -> None:
        for t in self._tensors():
            t.record_stream(stream)

    def pin_memory(self) -> TorchRecBatch:
        pinned = [t.pin_memory() for t in self._tensors()]
        return TorchRecBatch(*pinned, global_num_targets=self.global_num_targets, step=self.step)


# The pipeline traces `forward` with torch.fx to find the sharded collections' inputs (they
# must be plain attribute reads of the batch). Everything data-dependent after the lookups
# (splitting jagged rows, shapes from lengths) runs inside this wrapped function, which the
# tracer records as one opaque call instead of tracing through.
@torch.fx.wrap
def _dense_loss(dense: nn.Module, batch: TorchRecBatch,
                sequence: dict[str, JaggedTensor], pooled: KeyedTensor) -> torch.Tensor:
    jagged = batch.jagged()
    pooled_rows = pooled.to_dict()
    rows = {ITEM: torch.cat([sequence[f].values() for f in SEQUENCE_FEATURES])}
    rows.update({name: pooled_rows[name] for name in pooled_features(jagged.context_ids.shape[1])})
    return dense(assemble_lookups(jagged, rows), jagged)


class TorchRecModel(nn.Module):
    """`forward(batch) -> (loss * grad_scale, loss.detach())`: the pipeline backpropagates
    the first and returns the second from `progress()`. `loss` is this rank's share of the
    global mean loss (normalized by the global target count), as in every trainer;
    `grad_scale` undoes the averaging over ranks that DMP applies to every gradient (the
    trainer sets it to the world size; see torchrec_trainer's module docstring)."""

    def __init__(self, specs: list[TableSpec], dense: DenseArch,
                 device: torch.device | str = "meta", grad_scale: float = 1.0) -> None:
        super().__init__()
        self.grad_scale = float(grad_scale)
        by_name = {s.name: s for s in specs}
        item = by_name[ITEM]
        # No padding_idx: TorchRec has none, and id 0 never occurs in a batch, so row 0 gets
        # no gradient and keeps its initial zeros, as in nn.Embedding(padding_idx=0).
        self.sequence = EmbeddingCollection(
            tables=[EmbeddingConfig(num_embeddings=item.num_rows, embedding_dim=item.dim,
                                    name=ITEM, feature_names=list(SEQUENCE_FEATURES))],
            device=torch.device(device))
        pooled = [s for s in specs if s.name != ITEM]
        self.pooled = EmbeddingBagCollection(
            tables=[EmbeddingBagConfig(num_embeddings=s.num_rows, embedding_dim=s.dim,
                                       name=s.name, feature_names=[s.name],
                                       pooling=PoolingType.SUM) for s in pooled],
            device=torch.device(device))
        self.dense = dense
        for collection in (self.sequence, self.pooled):
            for spec in specs:
                if hasattr(collection, spec.name):
                    raise ValueError(f"table name {spec.name!r} clashes with an attribute of "
                                     f"{type(collection).__name__}")

    def forward(self, batch: TorchRecBatch) -> tuple[torch.Tensor, torch.Tensor]:
        sequence = self.sequence(batch.sequence)
        pooled = self.pooled(batch.pooled)
        loss = _dense_loss(self.dense, batch, sequence, pooled)
        return loss * self.grad_scale, loss.detach()
