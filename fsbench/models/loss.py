"""Sampled-softmax loss over a batch-shared set of negatives."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def sampled_softmax_token_losses(hidden: torch.Tensor, target_emb: torch.Tensor,
                                 negative_emb: torch.Tensor, target_ids: torch.Tensor,
                                 negative_ids: torch.Tensor) -> torch.Tensor:
    """Per-token loss (T,): cross-entropy over [positive, K negatives], positive at 0.

    hidden, target_emb: (T, D); negative_emb: (K, D); target_ids: (T,); negative_ids: (K,).
    A negative that happens to be the token's own target is masked (-inf): otherwise the
    same item would be pushed up and down at once.
    """
    positive = (hidden * target_emb).sum(dim=-1, keepdim=True)
    negative = (hidden @ negative_emb.T).masked_fill(
        target_ids.unsqueeze(1) == negative_ids.unsqueeze(0), float("-inf"))
    logits = torch.cat([positive, negative], dim=1)
    zeros = torch.zeros(hidden.shape[0], dtype=torch.int64, device=hidden.device)
    return F.cross_entropy(logits, zeros, reduction="none")
