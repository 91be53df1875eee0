"""The input pipeline: every trainer's input stage, run ahead of the step that trains it.

A trainer's `Preparer` (step -> StepInput: the global batch of that step, the rank's
share of it, a balancer's plan, a framework's batch type) is a pure function of the step.
The harness runs it in a `torch.utils.data.DataLoader` worker process, `prefetch` steps
ahead, exactly as a real data loader overlaps input with training, and the same way for
every trainer. A separate process (rather than a thread) keeps input work off the rank's
GIL and off its thread CPU time, which is its busy measure.

`InputPipeline` is the iterator a trainer's `step` pulls from. Each pull is an `input`
span: the time the rank waits for its next input (receiving it from the worker, and on
CUDA starting its copy to the device) is measured as input stall. With `workers=0` the
preparer runs in the rank's own thread at pull time: the input stage is then entirely
input stall (useful to see what prefetching hides, and in one-process tools).

On CUDA the pull also issues the host-to-device copy (`non_blocking`; from pageable
memory, as the inputs are not pinned yet): NOT YET RUN ON A GPU.
"""
from __future__ import annotations

import functools
import os
import time
from typing import Iterator

import torch
from torch.utils.data import DataLoader, Dataset

from fsbench.measurement.timeline import span
from fsbench.training.lifetime import loader_worker_init
from fsbench.training.trainer import Preparer, StepInput, map_tensors
from fsbench.workloads.batch import JaggedBatch


_JAGGED_FIELDS = ("item_ids", "targets", "lengths", "user_ids", "context_ids", "negative_ids")


class _PackedJagged:
    """A JaggedBatch as numpy arrays for the trip from the loader worker. Measured on the
    2-core VM (`small`, one rank's share): torch tensors cross a process boundary through
    shared-memory file descriptors, ~3.5 ms of the receiving thread's CPU per batch, and
    pickled tensors ~2.7 ms; numpy arrays ~0.8 ms, of which ~0.6 ms is the DataLoader's
    own receive path. Unpacking is zero-copy (torch.from_numpy)."""

    def __init__(self, batch: JaggedBatch) -> None:
        self.arrays = {f: getattr(batch, f).numpy() for f in _JAGGED_FIELDS}
        self.global_num_targets, self.step = batch.global_num_targets, batch.step

    def unpack(self) -> JaggedBatch:
        return JaggedBatch(**{f: torch.from_numpy(a) for f, a in self.arrays.items()},
                           global_num_targets=self.global_num_targets, step=self.step)


class _PackedTensor:
    """One tensor of `StepInput.aux` as a numpy array, for the same reason."""

    def __init__(self, t: torch.Tensor) -> None:
        self.array = t.numpy()


def _pack(item: StepInput) -> StepInput:
    batches = [_PackedJagged(b) if isinstance(b, JaggedBatch) else b for b in item.batches]
    return StepInput(item.step, batches, item.num_samples, item.num_targets, item.extra,
                     map_tensors(item.aux, _PackedTensor))


def _unpack(item: StepInput) -> StepInput:
    batches = [b.unpack() if isinstance(b, _PackedJagged) else b for b in item.batches]
    return StepInput(item.step, batches, item.num_samples, item.num_targets, item.extra,
                     map_tensors(item.aux, lambda p: torch.from_numpy(p.array), _PackedTensor))


def prepare_timed(prepare: Preparer, step: int, source=None) -> tuple[StepInput, int]:
    """Step `step`'s input and the input stage's CPU ns for it: the preparer's thread CPU
    time less the data source's reading of global batches (`MeteredSource.read_ns`: the
    synthetic generator makes the whole global batch, where a real data loader reads only
    the rank's samples by index; that reading is data, not the input stage's work)."""
    read0 = getattr(source, "read_ns", 0)
    cpu0 = time.thread_time_ns()
    item = prepare(step)
    cpu = time.thread_time_ns() - cpu0
    return item, max(0, cpu - (getattr(source, "read_ns", 0) - read0))


def steps_per_item(prepare: Preparer) -> int:
    """Steps a preparer prepares together (`prepare.steps_per_item`, default 1): a look-ahead
    window's steps share one plan, so one worker prepares them all and plans it once."""
    return max(1, int(getattr(prepare, "steps_per_item", 1)))


class _Steps(Dataset):
    """Map-style dataset whose item i is the prepared inputs (packed for transport) of
    steps [i*u, (i+1)*u), u = `steps_per_item(prepare)`. With several workers, each item
    goes to one worker: workers prepare different steps (a window's all in one)."""

    def __init__(self, prepare: Preparer, steps: int, source=None) -> None:
        self.prepare, self.steps, self.source = prepare, steps, source
        self.unit = steps_per_item(prepare)

    def __len__(self) -> int:
        return -(-self.steps // self.unit)

    def __getitem__(self, index: int) -> list[StepInput]:
        out = []
        for step in range(index * self.unit, min((index + 1) * self.unit, self.steps)):
            cpu0 = time.thread_time_ns()
            item, stage_ns = prepare_timed(self.prepare, step, self.source)
            item = _pack(item)
            # What the worker's CPU cost (on a machine without a spare core, the ranks'
            # run-queue wait): kept apart from contention by a neighbour.
            item.extra = {**item.extra, "input_worker_cpu_ns": time.thread_time_ns() - cpu0,
                          "input_stage_ns": stage_ns}
            out.append(item)
        return out


def _keep(item: list[StepInput]) -> list[StepInput]:
    """collate_fn for batch_size=None: the prepared inputs as they are."""
    return item


class InputPipeline:
    """Iterator over steps 0..steps-1's prepared inputs, on `device`.

    Args:
        prepare: the trainer's input stage (picklable when workers > 0).
        steps: how many steps the run has.
        device: where the inputs go.
        workers: loader worker processes (0: prepare inline, at pull time).
        prefetch: inputs each worker keeps ready ahead of the step that pulls them.
        source: the data source the preparer reads (`MeteredSource`), whose reading is
            left out of the input stage's CPU (`stage_cpu_ns`).
    """

    def __init__(self, prepare: Preparer, steps: int, device: torch.device, workers: int = 1,
                 prefetch: int = 2, source=None) -> None:
        self.device = device
        self.pulled = 0
        self.worker_cpu_ns: dict[int, int] = {}  # step -> its preparation's CPU time
        self.stage_cpu_ns: dict[int, int] = {}  # step -> the input stage's CPU, reading left out
        if workers == 0:
            self._it: Iterator[StepInput] = (self._inline(prepare, k, source) for k in range(steps))
            self._loader = None
        else:
            # Workers are forked (Linux default) after the process group exists, as with any
            # DataLoader in a DDP script; they never touch the group. Order is kept
            # (in_order), so the k-th pull is step k's input.
            self._loader = DataLoader(
                _Steps(prepare, steps, source), batch_size=None, shuffle=False, num_workers=workers,
                prefetch_factor=prefetch, collate_fn=_keep, persistent_workers=False,
                # A worker must die with its rank (fsbench.training.lifetime): a rank that
                # is killed cannot tell its workers to stop.
                worker_init_fn=functools.partial(loader_worker_init, os.getpid()))
            self._it = (_unpack(x) for items in self._loader for x in items)

    def _inline(self, prepare: Preparer, step: int, source) -> StepInput:
        item, self.stage_cpu_ns[step] = prepare_timed(prepare, step, source)
        return item

    def __iter__(self) -> "InputPipeline":
        return self

    def __next__(self) -> StepInput:
        with span("input", kind="input"):
            item = next(self._it)  # StopIteration after the last step ends the iteration
            if item.step != self.pulled:
                raise RuntimeError(f"input pipeline: expected step {self.pulled}, got {item.step}")
            self.pulled += 1
            if "input_worker_cpu_ns" in item.extra:
                extra = dict(item.extra)
                self.worker_cpu_ns[item.step] = extra.pop("input_worker_cpu_ns")
                self.stage_cpu_ns[item.step] = extra.pop("input_stage_ns")
                item.extra = extra
            return item.to(self.device)

    def close(self) -> None:
        """Stop the loader's workers (they also exit on their own when this rank dies)."""
        self._it = iter(())
        self._loader = None


class MeteredSource:
    """The workload's batch source as the harness hands it to a trainer.

    It counts the global batches generated in *this* process: the loader worker works on
    its own (forked) copy, so a rank whose count stays 0 provably generated no data in
    its training process, inside its steps or anywhere else (`batches_generated_in_rank`
    in each summary). It also times its reading (`read_ns`), which the input stage's CPU
    leaves out (`prepare_timed`), and applies `synthetic.input_delay_ms`, a data source that
    slow (sleeping), which the input-stall ground truth uses."""

    def __init__(self, source, input_delay_ms: float = 0.0) -> None:
        self.source, self.input_delay_s = source, input_delay_ms / 1e3
        self.generated = 0
        self.read_ns = 0  # thread CPU time spent making global batches (reading data)

    def global_batch(self, step: int) -> JaggedBatch:
        if self.input_delay_s > 0:
            time.sleep(self.input_delay_s)
        self.generated += 1
        cpu0 = time.thread_time_ns()
        try:
            return self.source.global_batch(step)
        finally:
            self.read_ns += time.thread_time_ns() - cpu0


class ContiguousShare:
    """The baselines' input stage: rank r's contiguous slice of step k's global batch
    (blind to lengths), as one micro-batch."""

    def __init__(self, source, rank: int, world_size: int) -> None:
        self.source, self.rank, self.world_size = source, rank, world_size

    def __call__(self, step: int) -> StepInput:
        local = self.source.global_batch(step).contiguous_slice(self.rank, self.world_size)
        return StepInput(step, [local], local.batch_size, local.num_targets)
