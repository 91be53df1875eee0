"""The jagged global batch: what every trainer receives at step k.

A batch holds B user histories of different lengths, packed without padding:

    item_ids   (T,)    int64   the input items of all histories, concatenated
    targets    (T,)    int64   the next item for each input position (same layout)
    lengths    (B,)    int64   history length of each sample, T = lengths.sum()
    user_ids   (B,)    int64   one user id per sample
    context_ids (B, C) int64   one id per categorical context table per sample
    negative_ids (K,)  int64   sampled negatives shared by the whole global batch

`global_num_targets` is the number of target tokens in the *global* batch. A slice
keeps it, so a rank that holds part of the batch still normalizes its loss by the
global count and the summed gradient does not depend on how samples were split.
Id 0 is padding in every table and never an input; a target of 0 marks a position that
is context only (real data's `window_targets`): it has no loss and is not counted.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class JaggedBatch:
    item_ids: torch.Tensor
    targets: torch.Tensor
    lengths: torch.Tensor
    user_ids: torch.Tensor
    context_ids: torch.Tensor
    negative_ids: torch.Tensor
    global_num_targets: int
    step: int = 0

    def __post_init__(self) -> None:
        n = int(self.lengths.sum())
        if self.item_ids.shape != (n,) or self.targets.shape != (n,):
            raise ValueError(
                f"item_ids/targets must have shape ({n},) = lengths.sum(); "
                f"got {tuple(self.item_ids.shape)} and {tuple(self.targets.shape)}"
            )
        b = self.lengths.shape[0]
        if self.user_ids.shape != (b,) or self.context_ids.shape[0] != b:
            raise ValueError(f"user_ids/context_ids must have {b} rows, one per sample")

    @property
    def batch_size(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def num_targets(self) -> int:
        """Target tokens in this (possibly partial) batch."""
        return int(self.item_ids.shape[0])

    @property
    def num_trained(self) -> int:
        """Targets this batch trains (not 0): its share of `global_num_targets`."""
        return int(torch.count_nonzero(self.targets))

    def trained_per_sample(self) -> torch.Tensor:
        """(B,) targets each sample trains: its positions whose target is not 0."""
        sample = torch.repeat_interleave(torch.arange(self.batch_size), self.lengths)
        return torch.zeros(self.batch_size, dtype=torch.int64).index_add_(
            0, sample, (self.targets != 0).to(torch.int64))

    @property
    def offsets(self) -> torch.Tensor:
        """(B+1,) start of each history in the packed tensors; offsets[-1] == T."""
        return torch.nn.functional.pad(torch.cumsum(self.lengths, 0), (1, 0))

    def to(self, device: torch.device | str) -> "JaggedBatch":
        """The same batch with every tensor on `device` (a no-op copy-free on CPU)."""
        move = lambda t: t.to(device, non_blocking=True)  # noqa: E731
        return JaggedBatch(
            item_ids=move(self.item_ids), targets=move(self.targets),
            lengths=move(self.lengths), user_ids=move(self.user_ids),
            context_ids=move(self.context_ids), negative_ids=move(self.negative_ids),
            global_num_targets=self.global_num_targets, step=self.step,
        )

    def select(self, indices: torch.Tensor | list[int]) -> "JaggedBatch":
        """The samples at `indices` (in that order), keeping global_num_targets."""
        idx = torch.as_tensor(indices, dtype=torch.int64)
        offsets = self.offsets
        starts, lens = offsets[idx], self.lengths[idx]
        # token positions of the chosen samples, in the chosen order
        token_idx = (
            torch.repeat_interleave(starts - torch.cumsum(lens, 0) + lens, lens)
            + torch.arange(int(lens.sum()))
        )
        return JaggedBatch(
            item_ids=self.item_ids[token_idx],
            targets=self.targets[token_idx],
            lengths=lens,
            user_ids=self.user_ids[idx],
            context_ids=self.context_ids[idx],
            negative_ids=self.negative_ids,
            global_num_targets=self.global_num_targets,
            step=self.step,
        )

    def between(self, lo: int, hi: int, token_lo: int, token_hi: int) -> "JaggedBatch":
        """Samples lo..hi (their tokens token_lo..token_hi, known to the caller: slices by
        host bounds, no gather), keeping global_num_targets."""
        return JaggedBatch(
            item_ids=self.item_ids[token_lo:token_hi], targets=self.targets[token_lo:token_hi],
            lengths=self.lengths[lo:hi], user_ids=self.user_ids[lo:hi],
            context_ids=self.context_ids[lo:hi], negative_ids=self.negative_ids,
            global_num_targets=self.global_num_targets, step=self.step,
        )

    def contiguous_slice(self, rank: int, world_size: int) -> "JaggedBatch":
        """Rank `rank`'s contiguous share (what the baselines do): B/N samples, the
        first B % N ranks take one more."""
        return self.select(contiguous_split(self.batch_size, world_size)[rank])


def contiguous_split(batch_size: int, world_size: int) -> list[list[int]]:
    """Sample indices per rank for a contiguous split of `batch_size` samples."""
    base, extra = divmod(batch_size, world_size)
    out, start = [], 0
    for r in range(world_size):
        n = base + (1 if r < extra else 0)
        out.append(list(range(start, start + n)))
        start += n
    return out


def concat_batches(parts: list[JaggedBatch], negative_ids: torch.Tensor,
                   global_num_targets: int, step: int) -> JaggedBatch:
    """Samples of several batches as one batch (e.g. a look-ahead window's re-packed step),
    with the given shared negatives and global target count."""
    cat = lambda name: torch.cat([getattr(p, name) for p in parts])  # noqa: E731
    return JaggedBatch(
        item_ids=cat("item_ids"), targets=cat("targets"), lengths=cat("lengths"),
        user_ids=cat("user_ids"), context_ids=cat("context_ids"), negative_ids=negative_ids,
        global_num_targets=global_num_targets, step=step,
    )
