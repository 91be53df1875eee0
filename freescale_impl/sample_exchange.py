"""Moving planned samples between ranks (`freescale.data=sharded`).

Each rank's loader read only its contiguous shard of the global batch. After the lengths
all-gather every rank knows every sample's length and computes the same plan, so every
rank also knows, without asking, how many samples and tokens each rank sends to each
other rank: no count exchange is needed. The samples then move in two all-to-alls with
uneven splits (a rank may send or receive nothing):

  per-sample  (n, 2 + C) int64: length, user id, the C context ids, one row per sample
  per-token   (t, 2)     int64: input item and target, packed history after history

Two, because the two kinds of rows have different widths and split sizes; every int64
field of a kind rides as a column of one tensor, so adding a field costs no collective.
The negatives, `global_num_targets` and `step` are the same on every rank and stay local.

A sender walks each destination's assignment in order and keeps the indices inside its
shard; a receiver gets its samples grouped by source rank and puts them back in its
assignment's order. Nothing outside `shard` is ever read. All index arithmetic runs on
the host from `all_lengths`, so on a GPU nothing waits for the device before the
collectives; the device only gathers rows with the finished indices.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from fsbench.measurement.timeline import span
from fsbench.workloads.batch import JaggedBatch


def exchange_samples(shard: JaggedBatch, shard_starts: Sequence[int], all_lengths: torch.Tensor,
                     assignment: Sequence[Sequence[int]], rank: int, group=None) -> JaggedBatch:
    """This rank's planned samples (`assignment[rank]`, in that order), gathered from the
    ranks whose shards hold them; equal to `global_batch.select(assignment[rank])`.

    shard: samples [shard_starts[rank], shard_starts[rank + 1]) of the global batch.
    shard_starts: where each rank's shard begins, with a final entry (the batch size).
    all_lengths: every sample's length (the lengths all-gather's result).
    assignment: per rank, the global indices it trains (lists or arrays); the same on
        every rank, as is `shard_starts`.
    """
    world = len(assignment)
    lo, hi = int(shard_starts[rank]), int(shard_starts[rank + 1])
    lengths = torch.as_tensor(all_lengths, dtype=torch.int64).cpu()
    if shard.batch_size != hi - lo or shard.num_targets != int(lengths[lo:hi].sum()):
        raise ValueError(f"rank {rank}: shard does not match samples [{lo}, {hi}) of all_lengths")
    plan = [torch.as_tensor(a, dtype=torch.int64).reshape(-1) for a in assignment]

    # Send side: for each destination, my shard's samples it trains, in its order.
    outgoing = [a[(a >= lo) & (a < hi)] for a in plan]
    send_samples = [len(o) for o in outgoing]
    send_tokens = [int(lengths[o].sum()) for o in outgoing]
    sent = torch.cat(outgoing) - lo  # positions in my shard
    shard_offsets = _offsets(lengths[lo:hi])
    sent_tokens = _token_index(shard_offsets[sent], lengths[lo:hi][sent])

    # Receive side: my samples arrive grouped by the rank whose shard holds them (in my
    # assignment's order within a source), so the splits follow from the plan alone.
    mine = plan[rank]
    source = torch.bucketize(mine, torch.as_tensor(shard_starts[1:-1], dtype=torch.int64),
                             right=True)
    arrival = torch.argsort(source, stable=True)  # j-th received sample = mine[arrival[j]]
    recv_samples = torch.bincount(source, minlength=world).tolist()
    recv_tokens = torch.zeros(world, dtype=torch.int64).index_add_(0, source, lengths[mine]).tolist()
    # Put them back in assignment order: my p-th sample is the back[p]-th received.
    back = torch.argsort(arrival)
    recv_lengths = lengths[mine[arrival]]
    kept_tokens = _token_index(_offsets(recv_lengths)[back], recv_lengths[back])

    device = shard.lengths.device
    sent, sent_tokens = sent.to(device), sent_tokens.to(device)
    per_sample = torch.cat([shard.lengths[sent, None], shard.user_ids[sent, None],
                            shard.context_ids[sent]], dim=1)
    per_token = torch.stack([shard.item_ids[sent_tokens], shard.targets[sent_tokens]], dim=1)
    got_samples = per_sample.new_empty((sum(recv_samples), per_sample.shape[1]))
    got_tokens = per_token.new_empty((sum(recv_tokens), 2))
    with span("sample_all_to_all", kind="comm"):
        dist.all_to_all_single(got_samples, per_sample, recv_samples, send_samples, group=group)
        dist.all_to_all_single(got_tokens, per_token, recv_tokens, send_tokens, group=group)

    rows = got_samples[back.to(device)]
    tokens = got_tokens[kept_tokens.to(device)]
    return JaggedBatch(
        item_ids=tokens[:, 0].contiguous(), targets=tokens[:, 1].contiguous(),
        lengths=rows[:, 0].contiguous(), user_ids=rows[:, 1].contiguous(),
        context_ids=rows[:, 2:].contiguous(), negative_ids=shard.negative_ids,
        global_num_targets=shard.global_num_targets, step=shard.step,
    )


def _offsets(lengths: torch.Tensor) -> torch.Tensor:
    """Start of each history in a packed tensor of histories with these lengths."""
    return torch.cumsum(lengths, 0) - lengths


def _token_index(starts: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """Positions of the tokens of histories (start, length), history after history."""
    # Each token's position = its history's start + its rank inside the history, where
    # the rank is its position in the output minus where its history begins there.
    shift = starts - _offsets(lens)
    return torch.repeat_interleave(shift, lens) + torch.arange(int(lens.sum()))
