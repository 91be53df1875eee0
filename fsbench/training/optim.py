"""The optimizer a workload names, built the same way for every trainer."""
from __future__ import annotations

import time
from typing import Iterable

import torch

from fsbench.config import WorkloadConfig


def make_optimizer(params: Iterable[torch.nn.Parameter], workload: WorkloadConfig) -> torch.optim.Optimizer:
    optimizer = _build(params, workload)
    stall_s = workload.synthetic.optimizer_sleep_ms / 1e3 if workload.compute == "synthetic" else 0
    if stall_s > 0:  # the ground truth's host stall inside the optimizer step (fsbench.models.synthetic)
        optimizer.register_step_pre_hook(lambda *_: time.sleep(stall_s))
    return optimizer


def _build(params: Iterable[torch.nn.Parameter], workload: WorkloadConfig) -> torch.optim.Optimizer:
    if workload.optimizer == "adam":
        # foreach=False: the same per-tensor arithmetic whichever trainer owns which
        # parameters, so trainers stay bit-comparable where reduction order allows.
        return torch.optim.Adam(params, lr=workload.lr, foreach=False)
    if workload.optimizer == "sgd":
        return torch.optim.SGD(params, lr=workload.lr, foreach=False)
    if workload.optimizer == "adagrad":
        return torch.optim.Adagrad(params, lr=workload.lr, foreach=False)
    raise AssertionError(f"optimizer {workload.optimizer!r} passed validation but is not built")
