"""The single-process reference's optimizer for each table or dense optimizer name: torch's
own (row-wise Adagrad: ours, checked against its formula in tests/test_optimizers.py).
Built here, not by fsbench.training.optim, so that a wrong mapping there cannot hide in
the reference too."""
from __future__ import annotations

import torch

from fsbench.training.rowwise_adagrad import RowwiseAdagrad


def torch_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    params = list(params)
    return {"adam": lambda: torch.optim.Adam(params, lr=lr, foreach=False),
            "sparse_adam": lambda: torch.optim.SparseAdam(params, lr=lr),
            "adagrad": lambda: torch.optim.Adagrad(params, lr=lr, foreach=False),
            "rowwise_adagrad": lambda: RowwiseAdagrad(params, lr=lr),
            "sgd": lambda: torch.optim.SGD(params, lr=lr, foreach=False)}[name]()
