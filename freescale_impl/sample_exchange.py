"""Moving planned samples between ranks (`freescale.data=sharded`).

Each rank's loader read only its contiguous shard of the global batch. After the lengths
all-gather every rank knows every sample's length and computes the same plan, so every
rank also knows, without asking, how many samples and tokens each rank sends to each
other rank. The samples then move in two all-to-alls with uneven splits:

  per-sample  (n, 2 + C) int64: length, user id, the C context ids
  per-token   (t, 2) int64: input item and target, packed history after history

A sender walks each destination's assignment in order and keeps the indices inside its
shard; a receiver gets its samples grouped by source rank and puts them back in its
assignment's order. Nothing outside `shard` is ever read.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from fsbench.timeline import span
from fsbench.workloads.batch import JaggedBatch


def exchange_samples(shard: JaggedBatch, shard_starts: list[int], all_lengths: torch.Tensor,
                     assignment: list[list[int]], rank: int, group=None) -> JaggedBatch:
    """This rank's planned samples (`assignment[rank]`, in that order), gathered from the
    ranks whose shards hold them. `shard_starts[r]` is where rank r's shard begins in the
    global batch (with a final entry: the batch size); `all_lengths` all samples' lengths."""
    n = len(assignment)
    lo, hi = shard_starts[rank], shard_starts[rank + 1]
    owner = torch.bucketize(torch.arange(shard_starts[-1]), torch.tensor(shard_starts[1:]),
                            right=True)  # global index -> rank whose shard holds it
    outgoing = [[i - lo for i in assignment[r] if lo <= i < hi] for r in range(n)]
    send_idx = [i for part in outgoing for i in part]
    mine = torch.as_tensor(assignment[rank], dtype=torch.int64)
    src = owner[mine] if len(mine) else mine
    # Received order: by source rank, each source's in my assignment's order.
    recv_order = torch.argsort(src, stable=True)
    send_samples = [len(p) for p in outgoing]
    recv_samples = torch.bincount(src, minlength=n).tolist()
    send_tokens = [int(shard.lengths[p].sum()) for p in outgoing]
    recv_tokens = [int(all_lengths[mine[src == s]].sum()) for s in range(n)]

    out = shard.select(send_idx)  # only rows of this rank's own shard
    device = shard.lengths.device
    per_sample = torch.cat([out.lengths[:, None], out.user_ids[:, None], out.context_ids], dim=1)
    per_token = torch.stack([out.item_ids, out.targets], dim=1)
    width = per_sample.shape[1]
    got_samples = per_sample.new_empty((sum(recv_samples), width))
    got_tokens = per_token.new_empty((sum(recv_tokens), 2))
    with span("sample_all_to_all", kind="comm"):
        dist.all_to_all_single(got_samples, per_sample.contiguous(), recv_samples, send_samples,
                               group=group)
        dist.all_to_all_single(got_tokens, per_token.contiguous(), recv_tokens, send_tokens,
                               group=group)
    received = JaggedBatch(item_ids=got_tokens[:, 0].contiguous(), targets=got_tokens[:, 1].contiguous(),
                           lengths=got_samples[:, 0].contiguous(), user_ids=got_samples[:, 1].contiguous(),
                           context_ids=got_samples[:, 2:].contiguous(),
                           negative_ids=shard.negative_ids, global_num_targets=shard.global_num_targets,
                           step=shard.step)
    # recv_order[j] = position in my assignment of the j-th received sample: invert it.
    back = torch.empty_like(recv_order)
    back[recv_order] = torch.arange(len(recv_order), device=recv_order.device)
    return received.select(back.to(device)) if len(back) else received
