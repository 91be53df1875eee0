"""SASRec encoder block (Kang & McAuley 2018), in the pre-LayerNorm form:

    x = x + Proj(CausalSoftmaxAttention(LayerNorm(x)))
    x = x + Linear(GELU(Linear(LayerNorm(x))))     FFN width 4 * dim, exact (erf) GELU

Hidden dropout (`model.dropout`, off by default) on both residual branches, drawn by token
so that every trainer computes the same function (fsbench.models.dropout); none on the
attention weights.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fsbench.models.dropout import NO_DROPOUT
from fsbench.models.jagged import JaggedLayout

FFN_MULT = 4


class SASRecBlock(nn.Module):
    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.norm_attn = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm_ffn = nn.LayerNorm(dim)
        self.ffn_in = nn.Linear(dim, FFN_MULT * dim)
        self.ffn_out = nn.Linear(FFN_MULT * dim, dim)

    def forward(self, x: torch.Tensor, layout: JaggedLayout, drop=NO_DROPOUT, site: int = 0) -> torch.Tensor:
        x = x + drop(self.proj(layout.bucketed(self.qkv(self.norm_attn(x)), self._attend)), site)
        return x + drop(self.ffn_out(F.gelu(self.ffn_in(self.norm_ffn(x)))), site + 1)

    def _attend(self, qkv: torch.Tensor) -> torch.Tensor:
        """(n, P, 3D) right-padded Q|K|V -> (n, P, D). Causal masking alone keeps padded
        keys (all after every real query) at zero weight."""
        q, k, v = (t.unflatten(-1, (self.num_heads, -1)).transpose(1, 2)
                   for t in qkv.chunk(3, dim=-1))  # each (n, H, P, D/H)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2).flatten(2)
