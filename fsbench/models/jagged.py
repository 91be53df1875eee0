"""Jagged (packed) sequences and length-bucketed attention.

Token-wise work (projections, FFN, LayerNorm, loss) runs on packed (T, D) values, so it
costs exactly T. Attention needs a (samples, length, length) layout; padding the whole
batch to its longest sample would make every sample cost like the longest one, which
breaks the cost model the load balancer relies on (cost ~ a*L^2 + b*L of the sample's
OWN length L). Instead each sample is padded only to its bucket length
`Bucketing.padded_length(L)`, samples with the same bucket length are attended together,
and the padding is dropped again.

Why padding never changes a result: samples are padded on the right and every attention
here is causal, so a real query (position i < L) never sees a padded key (position >= L);
padded query rows are computed but dropped before anything reads them, so they neither
reach the loss nor receive gradient.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True, slots=True)
class Bucketing:
    """Bucket lengths: multiples of `step` up to `linear_until`, then `per_octave` evenly
    spaced lengths per power of two. The defaults pad a sample of length L to at most
    max(L + 7, 1.25 L) and give 8 buckets up to 64, then 4 per power of two (each bucket
    is one attention call per layer: 15 cover lengths up to 200)."""
    step: int = 8
    linear_until: int = 64
    per_octave: int = 4

    def __post_init__(self) -> None:
        if self.step < 1 or self.per_octave < 1 or self.linear_until < 0:
            raise ValueError(f"bad {self}: need step >= 1, per_octave >= 1, linear_until >= 0")

    @classmethod
    def exact(cls) -> "Bucketing":
        """One bucket per distinct length: no padding at all (reference runs)."""
        return cls(step=1, linear_until=sys.maxsize)

    def padded_length(self, length: int) -> int:
        if length <= self.linear_until:
            quantum = self.step
        else:
            octave = 1 << ((length - 1).bit_length() - 1)  # length in (octave, 2 * octave]
            quantum = max(self.step, octave // self.per_octave)
        return -(-length // quantum) * quantum

    def padded_lengths(self, lengths) -> np.ndarray:
        """padded_length of each of many lengths (>= 1) at once (cost models call it on
        whole batches)."""
        L = np.asarray(lengths, dtype=np.int64)
        # (L - 1).bit_length() is frexp's exponent (exact for integers below 2^53)
        octave = np.left_shift(1, np.frexp(np.maximum(L - 1, 1))[1] - 1)
        quantum = np.where(L <= self.linear_until, self.step,
                           np.maximum(self.step, octave // self.per_octave))
        return -(-L // quantum) * quantum


@dataclass(frozen=True, slots=True)
class Bucket:
    padded_len: int
    num_samples: int
    start: int           # this bucket's tokens are x[layout.order][start:end]
    end: int
    slots: torch.Tensor  # (end - start,) row of each token in the (num_samples * padded_len) block


@dataclass(frozen=True, slots=True)
class JaggedLayout:
    """Index bookkeeping for one batch's lengths, computed once per forward and shared
    by all layers."""
    sample: torch.Tensor    # (T,) sample index of each token
    position: torch.Tensor  # (T,) position of each token within its sample
    length: torch.Tensor    # (T,) length of each token's sample
    order: torch.Tensor     # (T,) packed token indices grouped by bucket
    inverse: torch.Tensor   # (T,) inverse permutation of `order`
    buckets: tuple[Bucket, ...]

    @staticmethod
    def build(lengths: torch.Tensor, bucketing: Bucketing,
              device: torch.device | str = "cpu") -> "JaggedLayout":
        # Built on the CPU (bucket sizes must be Python ints anyway), then moved.
        lengths = lengths.detach().to("cpu", torch.int64)
        num_samples, num_tokens = lengths.shape[0], int(lengths.sum())
        sample = torch.repeat_interleave(torch.arange(num_samples), lengths)
        starts = torch.cumsum(lengths, 0) - lengths
        position = torch.arange(num_tokens) - starts[sample]

        distinct, which = torch.unique(lengths, return_inverse=True)
        padded = torch.tensor([bucketing.padded_length(n) for n in distinct.tolist()],
                              dtype=torch.int64)[which]
        by_bucket = torch.argsort(padded, stable=True)
        bucket_lens, bucket_sizes = torch.unique_consecutive(padded[by_bucket], return_counts=True)
        # Each sample's rank inside its bucket, then each token's row in its bucket's block.
        first_of_bucket = torch.cumsum(bucket_sizes, 0) - bucket_sizes
        rank = torch.arange(num_samples) - torch.repeat_interleave(first_of_bucket, bucket_sizes)
        sorted_lens = lengths[by_bucket]
        # Packed index of every token, taking the samples in bucket order:
        # start of its sample + (its index in the reordered stream - that sample's start there).
        order = (torch.repeat_interleave(starts[by_bucket] - torch.cumsum(sorted_lens, 0)
                                         + sorted_lens, sorted_lens)
                 + torch.arange(num_tokens))
        slots = (torch.repeat_interleave(rank * padded[by_bucket], sorted_lens) + position[order])
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(num_tokens)

        token_ends = torch.cumsum(sorted_lens, 0)[torch.cumsum(bucket_sizes, 0) - 1].tolist()
        buckets, token_start = [], 0
        for padded_len, size, token_end in zip(bucket_lens.tolist(), bucket_sizes.tolist(),
                                               token_ends):
            buckets.append(Bucket(padded_len, size, token_start, token_end,
                                  slots[token_start:token_end].to(device)))
            token_start = token_end
        if not buckets:
            # An empty batch (a rank that got no samples) still runs one empty attention
            # call, so every parameter joins the autograd graph and gets a (zero)
            # gradient: DDP waits for a gradient of every parameter on every rank.
            buckets.append(Bucket(1, 0, 0, 0, slots.to(device)))
        return JaggedLayout(sample=sample.to(device), position=position.to(device),
                            length=lengths[sample].to(device), order=order.to(device),
                            inverse=inverse.to(device), buckets=tuple(buckets))

    @property
    def padded_tokens(self) -> int:
        """Token positions attention computes, padding included."""
        return sum(b.num_samples * b.padded_len for b in self.buckets)

    def bucketed(self, x: torch.Tensor,
                 attend: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Apply `attend` bucket by bucket: (T, F) packed -> (T, F_out) packed.

        `attend` maps a right-padded block (samples, padded_len, F) to (samples,
        padded_len, F_out) and must be causal (position i reads only positions <= i);
        that is what keeps padded positions out of every real output. Padded rows of the
        input are zero.
        """
        # `split`, not slicing: a slice's backward writes into a zero tensor of the whole
        # input, which per bucket costs O(T) each and dominated the step time.
        blocks = x.index_select(0, self.order).split([b.end - b.start for b in self.buckets])
        outs = []
        for b, block in zip(self.buckets, blocks):
            padded = block.new_zeros(b.num_samples * b.padded_len, x.shape[1])
            padded = padded.index_copy(0, b.slots, block)
            out = attend(padded.view(b.num_samples, b.padded_len, x.shape[1]))
            outs.append(out.reshape(-1, out.shape[-1]).index_select(0, b.slots))
        return torch.cat(outs).index_select(0, self.inverse)
