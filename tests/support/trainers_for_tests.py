"""Trainers used only by tests, loaded by ranks as `trainers_for_tests:Class` (the tests put
this folder on PYTHONPATH). They wrap real trainers; nothing here stands in for one."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from baselines.ddp import DDPTrainer
from fsbench.training.inputs import ContiguousShare
from fsbench.training.trainer import StepStats


class RaiseOnRank1:
    """Rank 1 raises at step 1 while rank 0 waits in the next collective."""

    options: dict[str, str] = {}

    def setup(self, ctx, run, source) -> None:
        self.ctx, self.source = ctx, source

    def make_preparer(self):
        return ContiguousShare(self.source, self.ctx.rank, self.ctx.world_size)

    def step(self, inputs) -> StepStats:
        prepared = next(inputs)
        if self.ctx.rank == 1 and prepared.step == 1:
            raise ValueError("injected failure on rank 1")
        return StepStats(loss=0.0, num_samples=1, num_targets=1, step=prepared.step)

    def close(self) -> None:
        pass


class _GradDumpingOptimizer:
    """Saves every parameter's gradient (after DDP's all-reduce) before stepping."""

    def __init__(self, optimizer, named_params, path: Path) -> None:
        self.optimizer, self.named_params, self.path = optimizer, named_params, path
        self.dumped = False

    def step(self) -> None:
        if not self.dumped:  # first step only: that is what the reference computes
            grads = {n: p.grad.detach().clone() for n, p in self.named_params if p.grad is not None}
            torch.save(grads, self.path)
            self.dumped = True
        self.optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)


def wrap_with_grad_dump(trainer_cls):
    """A subclass of a real trainer whose optimizer dumps the first step's gradients to
    $FSBENCH_TEST_DUMP/grads-rank-<r>.pt."""

    class GradDump(trainer_cls):
        def setup(self, ctx, run, source) -> None:
            super().setup(ctx, run, source)
            path = Path(os.environ["FSBENCH_TEST_DUMP"]) / f"grads-rank-{ctx.rank}.pt"
            module = getattr(self.model, "module", self.model)
            self.optimizer = _GradDumpingOptimizer(self.optimizer, list(module.named_parameters()), path)

    GradDump.__name__ = f"GradDump{trainer_cls.__name__}"
    return GradDump


GradDumpDDP = wrap_with_grad_dump(DDPTrainer)


def _freescale():
    from freescale_impl.trainer import FreeScaleTrainer
    return FreeScaleTrainer


GradDumpFreeScale = wrap_with_grad_dump(_freescale())

# FreeScale's own step code: what a host sync made from it would be FreeScale's.
FREESCALE_STEP_FILES = ("sharded_step.py", "embedding_exchange.py", "exchange_plan.py",
                        "request_pipeline.py", "transport.py", "issue_queue.py", "sub_batches.py")


class HostSyncFreeScale(_freescale()):
    """FreeScale recording every call its own step code makes that would make a GPU's host
    wait (tests/support/host_syncs.py, direct calls, timed), into
    $FSBENCH_TEST_DUMP/syncs-rank-<r>.json as [step, call, file:line, monotonic ns]."""

    def step(self, inputs) -> StepStats:
        from host_syncs import HostSyncRecorder

        with HostSyncRecorder(*FREESCALE_STEP_FILES, direct=True) as recorder:
            stats = super().step(inputs)
        path = Path(os.environ["FSBENCH_TEST_DUMP"]) / f"syncs-rank-{self.ctx.rank}.json"
        found = json.loads(path.read_text()) if path.exists() else []
        path.write_text(json.dumps(found + [[stats.step, *f] for f in recorder.found]))
        return stats


class InjectedDDP(DDPTrainer):
    """DDP with a known extra cost, for calibrating regression gates (fsbench.gates.gate):
    FSBENCH_TEST_SLOWDOWN=f adds f x the step's own wall time as compute on every rank
    (step time about +f); FSBENCH_TEST_STRAGGLE=f adds it on rank 0 only (a straggler:
    the bubble grows); FSBENCH_TEST_STALL_EVERY=k doubles every k-th step on every rank
    (an intermittent stall: step time about +1/k in total, the median step unchanged).
    The extra is real thread CPU in a compute span, measured like any compute."""

    def step(self, inputs) -> StepStats:
        import time

        from fsbench.measurement.timeline import span

        wall0 = time.monotonic_ns()
        stats = super().step(inputs)
        factor = float(os.environ.get("FSBENCH_TEST_SLOWDOWN", "0"))
        if self.ctx.rank == 0:
            factor += float(os.environ.get("FSBENCH_TEST_STRAGGLE", "0"))
        every = int(os.environ.get("FSBENCH_TEST_STALL_EVERY", "0"))
        if every and stats.step % every == 0:
            factor += 1.0
        if factor > 0:
            target = time.thread_time_ns() + factor * (time.monotonic_ns() - wall0)
            with span("injected", kind="compute"):
                while time.thread_time_ns() < target:
                    pass
        return stats


class StaleEmbeddingDDP(DDPTrainer):
    """A broken trainer (`fsbench quality` must flag it): the semi-synchronous shortcut.
    Each step's forward and backward read the embedding tables as they were one update
    ago; the gradients are applied to the current tables. Its losses and gradients are
    those of another function, so its training follows another trajectory."""

    def setup(self, ctx, run, source) -> None:
        super().setup(ctx, run, source)
        self._tables = list(self.model.module.sparse.parameters())
        self._previous = None  # the tables before the last update
        self.optimizer = _RestoreThenStep(self.optimizer, self)

    def step(self, inputs) -> StepStats:
        self._current = [t.detach().clone() for t in self._tables]
        if self._previous is not None:
            with torch.no_grad():
                for table, stale in zip(self._tables, self._previous):
                    table.copy_(stale)
        return super().step(inputs)


class _RestoreThenStep:
    """StaleEmbeddingDDP's optimizer: put the current tables back, then update them."""

    def __init__(self, optimizer, trainer: StaleEmbeddingDDP) -> None:
        self.optimizer, self.trainer = optimizer, trainer

    def step(self) -> None:
        t = self.trainer
        with torch.no_grad():
            for table, current in zip(t._tables, t._current):
                table.copy_(current)
        t._previous = t._current
        self.optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)


class DroppedRankDDP(DDPTrainer):
    """A broken trainer (`fsbench quality` must flag it): the last rank's gradients never
    reach the all-reduce (zeroed as they are computed), so every update misses its share
    of the global batch. Its reported losses are the true ones."""

    def setup(self, ctx, run, source) -> None:
        super().setup(ctx, run, source)
        if ctx.rank == ctx.world_size - 1:
            for p in self.model.parameters():
                p.register_hook(torch.zeros_like)


def wrap_with_model_dump(trainer_cls):
    """A subclass of a real trainer that also saves the model its `trained_model()` hands
    to the evaluation (rank 0) to $FSBENCH_TEST_DUMP/trained-model.pt: the last call,
    after training, leaves the final one."""

    class ModelDump(trainer_cls):
        def trained_model(self):
            model = super().trained_model()
            if model is not None:
                path = Path(os.environ["FSBENCH_TEST_DUMP"]) / "trained-model.pt"
                torch.save(model.state_dict(), path)
            return model

    ModelDump.__name__ = f"ModelDump{trainer_cls.__name__}"
    return ModelDump


ModelDumpDDP = wrap_with_model_dump(DDPTrainer)
ModelDumpFreeScale = wrap_with_model_dump(_freescale())


def wrap_with_final_model_dump(trainer_cls):
    """`wrap_with_model_dump` whose trainer also hands over its model when it closes
    (after the last step; a collective for sharded tables, and every rank closes): runs
    without evaluation leave their final model in trained-model.pt too."""

    class FinalModelDump(wrap_with_model_dump(trainer_cls)):
        def close(self) -> None:
            self.trained_model()
            super().close()

    FinalModelDump.__name__ = f"FinalModelDump{trainer_cls.__name__}"
    return FinalModelDump


FinalModelDumpDDP = wrap_with_final_model_dump(DDPTrainer)
FinalModelDumpFreeScale = wrap_with_final_model_dump(_freescale())


def __getattr__(name: str):
    # Built on first use: torchrec (and fbgemm) and deepspeed are slow optional extras.
    if name == "ModelDumpTorchRec":
        from baselines.torchrec_trainer import TorchRecTrainer

        return wrap_with_model_dump(TorchRecTrainer)
    if name == "ModelDumpDeepSpeed":
        from baselines.deepspeed_trainer import DeepSpeedTrainer

        return wrap_with_model_dump(DeepSpeedTrainer)
    if name == "FinalModelDumpTorchRec":
        from baselines.torchrec_trainer import TorchRecTrainer

        return wrap_with_final_model_dump(TorchRecTrainer)
    if name == "FinalModelDumpDeepSpeed":
        from baselines.deepspeed_trainer import DeepSpeedTrainer

        return wrap_with_final_model_dump(DeepSpeedTrainer)
    raise AttributeError(name)
