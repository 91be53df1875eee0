"""Row-wise Adagrad: Adagrad with one accumulator per embedding row instead of one per
element, the optimizer TorchRec's fused tables default to (fbgemm's
EXACT_ROWWISE_ADAGRAD): a row's accumulator grows by the mean of its squared gradient,
and the whole row steps by lr / (sqrt(accumulator) + eps). It keeps 1/dim of Adagrad's
state. A row whose gradient is zero does not move (its accumulator grows by 0 and it
steps by 0), so stepping a replicated table's dense gradient equals stepping only the
rows a batch read: sharded tables use `rowwise_adagrad_rows` on their touched rows.
"""
from __future__ import annotations

from typing import Iterable

import torch

EPS = 1e-10  # torch.optim.Adagrad's default; the torchrec trainer gives fbgemm the same


@torch.no_grad()
def rowwise_adagrad_rows(param: torch.Tensor, sum_sq: torch.Tensor, grad: torch.Tensor,
                         lr: float, eps: float = EPS) -> None:
    """One step, in place, of rows `param` (R, D) with their accumulators `sum_sq` (R,)
    and summed gradients `grad` (R, D)."""
    sum_sq.add_(grad.square().mean(dim=1))
    param.addcmul_(grad, sum_sq.sqrt().add_(eps).reciprocal().mul_(lr).unsqueeze(1), value=-1)


class RowwiseAdagrad(torch.optim.Optimizer):
    """Row-wise Adagrad over 2-D parameters (embedding tables) with dense gradients."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, eps: float = EPS) -> None:
        super().__init__(params, {"lr": lr, "eps": eps})

    @torch.no_grad()
    def step(self, closure=None) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse or p.dim() != 2:
                    raise ValueError("RowwiseAdagrad steps 2-D tables with dense gradients")
                state = self.state[p]
                if "sum_sq" not in state:
                    state["sum_sq"] = torch.zeros(p.shape[0], dtype=p.dtype, device=p.device)
                rowwise_adagrad_rows(p, state["sum_sq"], p.grad, group["lr"], group["eps"])
