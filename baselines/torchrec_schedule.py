"""TorchRec's training step as ops (fsbench.training.step_program): what
`TrainPipelineSparseDist.progress` runs for the torchrec trainer, in its order, with the
collectives TorchRec 1.x issues on a run of our models (a sequence collection for the
item history, a pooled one for user and contexts). The simulator costs this program;
tests/test_step_programs.py holds it against the recorded timeline at 2 and 4 ranks.

Its collectives are TorchRec's own, recorded under their torch functions' names
(fsbench.measurement.flights): `all_to_all_single` and DDP's `all_reduce`. All run on one
channel (Comm.channel's default, `world`): DistributedModelParallel built without an `env`
shards over `ShardingEnv.from_process_group(dist.GroupMember.WORLD)`, and its
DefaultDataParallelWrapper gives DDP that same group (torchrec.distributed.model_parallel),
so input dists, lookups, gradients and dense buckets follow each other on one stream."""
from __future__ import annotations

from fsbench.training.step_program import (Bucket, Comm, Compute, Issue, Op, Span, StepProgram, Wait,
                                           ddp_backward)

A2A = "all_to_all_single"
COLLECTIONS = 2  # sequence (item history) and pooled (user, contexts)


def torchrec_step_program(buckets: list[Bucket], pipeline: str = "sparse") -> StepProgram:
    """pipeline=sparse: batch k+1's input dist was started during step k-1 (its splits);
    its ids go out and are waited before k's forward, and k+2's start after it. base:
    the whole input dist of batch k inside its forward. The lookups' output all-to-alls
    are waited inside forward, the gradients' inside backward (fused table updates);
    DDP's dense buckets go first in backward (their hook fires before the embeddings'
    gradients exist)."""
    splits = [Comm(f"tr.splits_{i}", "all_to_all", "input_lengths", 1 / (2 * COLLECTIONS),
                   next_step=True, flight=A2A) for i in range(2 * COLLECTIONS)]
    ids = Comm("tr.ids", "all_to_all", "input_ids", flight=A2A)
    rows = [Comm(f"tr.rows_{i}", "all_to_all", "rows", 1 / COLLECTIONS, flight=A2A) for i in range(COLLECTIONS)]
    grads = [Comm(f"tr.grads_{i}", "all_to_all", "row_grads", 1 / COLLECTIONS, flight=A2A)
             for i in range(COLLECTIONS)]
    ops: list[Op] = [Compute("optimizer", 0.0)]  # the pipeline's zero_grad
    inputs = [Issue(ids), *(Wait(s, implicit=True) for s in splits), Wait(ids, span="input_dist")]
    if pipeline == "sparse":
        ops += inputs
    ops += [Compute("forward", 0.0)]
    if pipeline != "sparse":
        ops += [*(Issue(s) for s in splits), *inputs]
    for r in rows:
        ops += [Issue(r), Wait(r, implicit=True)]
    ops += [Compute("forward", 1.0)]
    if pipeline == "sparse":
        ops += [*(Issue(s) for s in splits), Span("input_dist")]
    ops += ddp_backward(buckets, "tr.dense", "all_reduce", after_last=tuple(Issue(g) for g in grads))
    ops += [*(Wait(g, implicit=True) for g in grads), Compute("table_update"), Compute("optimizer")]
    return StepProgram(tuple(ops))
