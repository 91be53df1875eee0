"""Dropout that every trainer draws alike (`model.dropout`).

torch's dropout draws its mask from the rank's random generator, so a sample's mask
would depend on which rank trained it and what that rank drew before: DDP, FreeScale
(which moves samples between ranks) and TorchRec would then compute different functions
of the same global batch, and their losses could not be compared step for step. Here a
token's mask is a hash of what the token is (its sample's user, its position, its input
and target items), the step, the layer and site, and the column: the same wherever and
in whatever order the token is computed, new at every step. Integer arithmetic (int64,
wrapping) gives the same bits on every CPU and GPU.

Where: on the summed input embeddings, and on each block's residual branches (SASRec:
after attention's projection and after the FFN; HSTU: after its output projection), as
SASRec's and RecBole's hidden dropout; attention weights are not dropped.
"""
from __future__ import annotations

import torch

_MUL = (0x9E3779B97F4A7C15 - (1 << 64), 0xBF58476D1CE4E5B9 - (1 << 64),
        0x94D049BB133111EB - (1 << 64))  # splitmix64's constants, as signed int64
_BITS = 24  # the uniform's resolution: p is rounded to a multiple of 2^-24


def _mix(h: torch.Tensor) -> torch.Tensor:
    """A splitmix64-style finalizer on int64 (arithmetic shifts: a different, equally
    deterministic mix than the unsigned one)."""
    h = (h ^ (h >> 30)) * _MUL[1]
    h = (h ^ (h >> 27)) * _MUL[2]
    return h ^ (h >> 31)


def token_keys(step: int, user_ids: torch.Tensor, sample: torch.Tensor, position: torch.Tensor,
               item_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(T,) int64: one key per packed token, from the step and what the token is (its
    sample's user, its position in the history, its input and target item)."""
    h = torch.full_like(item_ids, step) * _MUL[0] + user_ids.index_select(0, sample)
    for part in (position, item_ids, targets):
        h = _mix(h) * _MUL[0] + part
    return _mix(h)


def for_batch(p: float, training: bool, batch, layout) -> "KeyedDropout":
    """The dropout of one forward: keyed by the batch's tokens while training with p > 0,
    else none (no keys computed)."""
    if not training or p <= 0:
        return NO_DROPOUT
    return KeyedDropout(p, token_keys(batch.step, batch.user_ids, layout.sample, layout.position,
                                      batch.item_ids, batch.targets))


class KeyedDropout:
    """Drops each element of a packed (T, D) activation with probability p, by its
    token's key, a site number and its column; identity without keys (NO_DROPOUT)."""

    def __init__(self, p: float, keys: torch.Tensor | None):
        self.p, self.keys = p, keys

    def __call__(self, x: torch.Tensor, site: int) -> torch.Tensor:
        if self.keys is None:
            return x
        columns = torch.arange(x.shape[1], device=x.device, dtype=torch.int64)
        h = _mix(_mix(self.keys * _MUL[0] + site).unsqueeze(1) * _MUL[0] + columns)
        keep = (h & ((1 << _BITS) - 1)) >= round(self.p * (1 << _BITS))
        return x * keep.to(x.dtype) / (1 - self.p)


NO_DROPOUT = KeyedDropout(0.0, None)
