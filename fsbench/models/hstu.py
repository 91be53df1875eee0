"""HSTU encoder block (Zhai et al. 2024, "Actions Speak Louder than Words").

    U, V, Q, K = split(SiLU(Linear(LayerNorm(x))))
    A[i, j]    = SiLU(<Q_i, K_j> + bias[clip(i - j)]) / n    for j <= i, else 0
    y          = Linear(LayerNorm(A V) * U);   x = x + y

Choices the paper leaves open:
  * n is the sample's OWN length L (not the padded or batch-max length, which would make
    a sample's output depend on its batch-mates). The LayerNorm right after A V undoes
    any per-token scale, so the choice of n only matters through LayerNorm's eps.
  * Q K^T is not scaled by 1/sqrt(d/heads) (pointwise SiLU, not a softmax).
  * The relative-position bias is one learned scalar per head and distance i - j,
    distances >= max_distance - 1 share the last entry; it starts at zero.
Hidden dropout (`model.dropout`, off by default) on the residual branch, drawn by token
(fsbench.models.dropout).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fsbench.models.dropout import NO_DROPOUT
from fsbench.models.jagged import JaggedLayout


class HSTUBlock(nn.Module):
    zero_init = ("rel_pos_bias",)  # read by init.init_module_

    def __init__(self, dim: int, num_heads: int, max_distance: int):
        super().__init__()
        self.dim, self.num_heads = dim, num_heads
        self.norm_in = nn.LayerNorm(dim)
        self.uvqk = nn.Linear(dim, 4 * dim)
        self.rel_pos_bias = nn.Parameter(torch.empty(num_heads, max_distance))
        self.norm_attn = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, layout: JaggedLayout, drop=NO_DROPOUT, site: int = 0) -> torch.Tensor:
        u, vqk = F.silu(self.uvqk(self.norm_in(x))).split([self.dim, 3 * self.dim], dim=-1)
        av = layout.bucketed(vqk, self._attend) / layout.length.unsqueeze(1).to(x.dtype)
        return x + drop(self.out(self.norm_attn(av) * u), site)

    def _attend(self, vqk: torch.Tensor) -> torch.Tensor:
        """(n, P, 3D) right-padded V|Q|K -> (n, P, D) causal pointwise attention A V."""
        length = vqk.shape[1]
        v, q, k = (t.unflatten(-1, (self.num_heads, -1)).transpose(1, 2)
                   for t in vqk.chunk(3, dim=-1))  # each (n, H, P, D/H)
        pos = torch.arange(length, device=vqk.device)
        distance = pos.unsqueeze(1) - pos.unsqueeze(0)  # i - j
        # index_select, not advanced indexing: its backward (index_add) is cheaper than
        # the accumulating index_put that `bias[:, idx]` backpropagates through.
        clipped = distance.clamp(0, self.rel_pos_bias.shape[1] - 1).flatten()
        bias = self.rel_pos_bias.index_select(1, clipped).view(-1, length, length)
        scores = F.silu(q @ k.transpose(-1, -2) + bias)
        # Zero (not -inf: SiLU(-inf) is NaN) every j > i; this also hides right padding.
        weights = scores.masked_fill(distance < 0, 0.0)
        return (weights @ v).transpose(1, 2).flatten(2)
