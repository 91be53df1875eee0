"""PyTorch DDP's gradient buckets, for the simulator: how many all-reduce calls a step
makes and of what sizes (fsbench.scaling.simulate). Checked against real DDP's buckets through a
comm hook (tests/test_simulate.py)."""
from __future__ import annotations

import functools

from fsbench.config import WorkloadConfig

DDP_BUCKET_BYTES = 25 * 2**20


def dense_grad_bytes(workload: WorkloadConfig) -> tuple[float, ...]:
    """Bytes of each encoder parameter in the order its gradient is ready in backward:
    the order DDP fills its buckets in from its second step on. Taken from one backward
    of the real encoder on a small batch (post-accumulate hooks; the tables shrunk, which
    changes no encoder parameter), or of the emulation's wait (`compute=emulated`: its
    order differs, and so do its buckets); parameters that got no gradient come last.
    What does not shape the encoder (batch, lengths, vocabularies, data) is set to one
    value, so every world size and batch of a sweep shares one measurement."""
    vocab = max(1024, 4 * workload.num_negatives)
    # Short samples: the order does not depend on lengths, and `large`'s 4096 would
    # take gigabytes.
    probe = WorkloadConfig(name="gradient-order", model=workload.model, item_vocab=vocab, user_vocab=vocab,
                           context_vocabs=tuple(vocab for _ in workload.context_vocabs),
                           max_seq_len=workload.max_seq_len, global_batch_size=4, steps=1, warmup=0,
                           lengths=f"fixed:{min(16, workload.max_seq_len)}", num_negatives=workload.num_negatives)
    return _grad_ready_bytes(probe, workload.compute == "emulated")


@functools.lru_cache(maxsize=16)
def _grad_ready_bytes(probe: WorkloadConfig, emulated: bool) -> tuple[float, ...]:
    from fsbench.costmodel.timing import CALIBRATION_SEED, encoder_inputs
    from fsbench.models import build_model
    from fsbench.workloads.generator import SyntheticBatches

    model = build_model(probe, seed=0)
    batch = SyntheticBatches(probe, seed=CALIBRATION_SEED).global_batch(0)
    params = list(model.dense.parameters())
    order: list[int] = []
    hooks = [p.register_post_accumulate_grad_hook(lambda _, i=i: order.append(i)) for i, p in enumerate(params)]
    try:
        lookups = encoder_inputs(model, batch)
        if emulated:  # gradients come all at once, in its order
            from fsbench.models.emulation import waiting_loss

            waiting_loss(0.0, model.dense, lookups).backward()
        else:
            model.dense(lookups, batch).backward()
    finally:
        for hook in hooks:
            hook.remove()
    order += [i for i in reversed(range(len(params))) if i not in order]
    return tuple(4.0 * params[i].numel() for i in order)


def ddp_buckets(ready_bytes: list[float], cap_bytes: float = DDP_BUCKET_BYTES) -> list[float]:
    """Bytes of each all-reduce call PyTorch DDP makes once it has rebuilt its buckets
    after its first step: the parameters, in the order their gradients are ready, fill
    buckets of `cap_bytes` (bucket_cap_mb: the workload's `dense_bucket_mb`, which every
    trainer passes; DDP's 1 MiB first bucket is its default's only); a bucket closes once
    it reaches its cap, so a larger parameter fills one alone. Each call pays its own
    latency, which on a host of more ranks than cores is most of its cost (gloo at 16
    ranks on 2 cores: 72 ms per call, small or not)."""
    out, current, cap = [], 0.0, cap_bytes
    for size in ready_bytes:
        current += size
        if current >= cap:
            out.append(current)
            current, cap = 0.0, cap_bytes
    if current > 0:
        out.append(current)
    return out


def step_buckets(workload: WorkloadConfig, replica_bytes: list[float] = ()) -> list:
    """DDP's buckets of a step (the workload's `dense_bucket_mb`) as a step program takes them
    (fsbench.training.step_program.Bucket): the encoder's gradients, then the replicated
    tables' (`replica_bytes`, in reverse registration order: read first in forward, so ready
    last); each bucket full as far into the backward as the encoder's bytes in it say, a
    bucket holding a table's at the backward's end."""
    from fsbench.training.step_program import Bucket

    dense = list(dense_grad_bytes(workload))
    sizes = ddp_buckets(dense + list(replica_bytes), workload.dense_bucket_mb * 2**20)
    total, filled, out = sum(dense) or 1.0, 0.0, []
    for size in sizes:
        filled += size
        out.append(Bucket(size, min(1.0, filled / total)))
    return out
