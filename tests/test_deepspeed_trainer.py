"""The DeepSpeed baseline runs under fsbench and computes the same function as DDP.

Same function: with the same initial weights (seeded build_model), data (the seeded global
batch, contiguous split) and optimizer settings, the global loss of each of the first 5
steps (`summary["losses"]`) equals DDP's:
- step 0 within one float32 ulp (1.2e-7 relative): no optimizer step has happened, both
  run the same forward on the same weights and samples (measured: bit-identical);
- steps 1-4 within 1e-5 relative: each depends on the updates before it, and DeepSpeed
  may reduce gradients in another order (ranks > 2), apply the 1/N of its mean elsewhere
  (before vs after the collective) and run the optimizer over ZeRO's flattened
  partitions, each worth float32 ulps per update (measured at 2 ranks: bit-identical).
  A gradient off by the world size moves the SGD loss (lr 1e-2, seed 3) by 1.9e-4
  relative at step 1 and 1.6e-3 at step 3 (measured), 19x-160x the tolerance:
  `test_wrong_gradient_scale_is_caught` proves the check fails.
The scale-sensitive checks use SGD: Adam's update m/(sqrt(v)+eps) is invariant to a
global gradient scale up to eps, so an Adam loss curve cannot see a factor 2 (measured:
~1e-7 relative). Adam is still checked: the default run, and DeepSpeed's Adam mapping.

The first DeepSpeed run of a checkout JIT-compiles DeepSpeed's shm comm op (40-60 s on
2 cores) into <repo>/.torch_extensions; later runs load it (~4 s per tiny run).
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch

from fsbench.config import ConfigError, RunConfig
from fsbench.running.runner import SUMMARY_KEYS, run_once
from fsbench.measurement.timeline import read_timelines
from fsbench.training.trainer import trainer_options
from fsbench.workloads.presets import tiny

# Only the missing third-party extra may skip; an ImportError in our own trainer fails.
pytest.importorskip("deepspeed", reason="deepspeed is not installed: pip install -e '.[deepspeed]'")
import baselines.deepspeed_trainer as dst  # noqa: E402

# Asserts nothing a test running beside it can move: the dist tier runs it two at a time.
pytestmark = pytest.mark.parallel_safe

DS = "deepspeed"
HERE = Path(__file__).resolve().parent
WORLD = 2
SEED = 3
STEP0_RTOL = 1.2e-7  # one float32 ulp
RTOL = 1e-5
# Generous: the first run of a fresh checkout compiles the shm op.
RUN_TIMEOUT_S = 240

ADAM = dataclasses.replace(tiny(), steps=5, optimizer="adam", lr=1e-3)
SGD = dataclasses.replace(tiny(), steps=5, optimizer="sgd", lr=1e-2)


# --- test-only subclasses, loaded by the ranks as `test_deepspeed_trainer:<Class>` ---

class UnscaledDeepSpeedTrainer(dst.DeepSpeedTrainer):
    """Deliberately wrong: forgets to undo DeepSpeed's mean over ranks."""

    def grad_scale(self, dp_world_size: int) -> float:
        return 1.0


class AdamCheckedDeepSpeedTrainer(dst.DeepSpeedTrainer):
    """The real trainer, asserting in every rank that DeepSpeed built plain torch Adam
    with fsbench's settings (DeepSpeed's "Adam" would otherwise be AdamW)."""

    def setup(self, ctx, run, source) -> None:
        super().setup(ctx, run, source)
        opt = self.engine.basic_optimizer
        assert type(opt) is torch.optim.Adam, type(opt)
        group = opt.param_groups[0]
        assert group["lr"] == run.workload.lr and group["weight_decay"] == 0
        assert group["foreach"] is False and group["amsgrad"] is False
        assert group["betas"] == (0.9, 0.999) and group["eps"] == 1e-8


# --- helpers ---

@pytest.fixture
def ranks_import_this_module(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(HERE), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))


def run(out: Path, trainer: str, workload, options: dict | None = None) -> tuple[Path, dict]:
    return run_once(RunConfig(workload=workload, trainer=trainer, world_size=WORLD, seed=SEED,
                              trainer_options=options or {}), out, timeout_s=RUN_TIMEOUT_S)


@pytest.fixture(scope="module")
def ddp_losses(tmp_path_factory):
    """DDP's per-step global losses, per workload (each run once per module)."""
    cache: dict[str, list[float]] = {}

    def get(workload) -> list[float]:
        key = workload.optimizer
        if key not in cache:
            _, summary = run(tmp_path_factory.mktemp(f"ddp-{key}"), "ddp", workload)
            cache[key] = summary["losses"]
        return cache[key]

    return get


def assert_same_losses(got: list[float], ref: list[float]) -> None:
    assert len(got) == len(ref) == 5, (got, ref)
    assert abs(got[0] - ref[0]) <= STEP0_RTOL * abs(ref[0]), ("step 0", got[0], ref[0])
    for k in range(1, len(ref)):
        rel = abs(got[k] - ref[k]) / abs(ref[k])
        assert rel <= RTOL, (f"step {k}: relative difference {rel:.2e} > {RTOL}", got, ref)


# --- runs (gloo, 2 ranks) ---

@pytest.mark.dist
def test_tiny_two_ranks_with_defaults(tmp_path, ddp_losses):
    """Default options (ZeRO 2, Adam): completes, reports, and matches DDP."""
    run_dir, summary = run(tmp_path, DS, ADAM)
    assert set(SUMMARY_KEYS) <= set(summary)
    assert summary["trainer"] == DS and summary["world_size"] == WORLD
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    spans = read_timelines(run_dir)
    for name in ("forward", "backward", "optimizer"):
        assert (spans["name"] == name).sum() == WORLD * ADAM.steps, name
    assert_same_losses(summary["losses"], ddp_losses(ADAM))


@pytest.mark.dist
@pytest.mark.parametrize("stage", ["0", "1", "2", "3"])
def test_same_losses_as_ddp(stage, tmp_path, ddp_losses):
    _, summary = run(tmp_path, DS, SGD, {"zero_stage": stage})
    assert_same_losses(summary["losses"], ddp_losses(SGD))


@pytest.mark.dist
def test_adam_is_torch_adam(tmp_path, ddp_losses, ranks_import_this_module):
    """ZeRO 3 (parameters partitioned) with DeepSpeed's Adam config: torch.optim.Adam,
    fsbench's hyperparameters, DDP's losses."""
    _, summary = run(tmp_path, "test_deepspeed_trainer:AdamCheckedDeepSpeedTrainer", ADAM,
                     {"zero_stage": "3"})
    assert_same_losses(summary["losses"], ddp_losses(ADAM))


@pytest.mark.dist
def test_wrong_gradient_scale_is_caught(tmp_path, ddp_losses, ranks_import_this_module):
    """Negative control: without the world-size loss scaling the gradients are half the
    true ones; step 0 still agrees, and the same check as above fails."""
    _, summary = run(tmp_path, "test_deepspeed_trainer:UnscaledDeepSpeedTrainer", SGD,
                     {"zero_stage": "2"})
    ref = ddp_losses(SGD)
    assert abs(summary["losses"][0] - ref[0]) <= STEP0_RTOL * abs(ref[0])
    with pytest.raises(AssertionError, match="step 1"):
        assert_same_losses(summary["losses"], ref)


# --- no processes ---

@pytest.mark.parametrize("bad", ["4", "-1", "two", "", "2.0"])
def test_bad_zero_stage_is_one_line_config_error(bad):
    with pytest.raises(ConfigError) as e:
        trainer_options(DS, {"zero_stage": bad})
    msg = str(e.value)
    assert "\n" not in msg
    assert "deepspeed.zero_stage" in msg and "0, 1, 2, 3" in msg


def test_options_and_notes():
    assert trainer_options(DS, {}) == {"zero_stage": "2"}
    assert trainer_options(DS, {"zero_stage": "3"}) == {"zero_stage": "3"}
    with pytest.raises(ConfigError, match="unknown option.*zero_stage"):
        trainer_options(DS, {"stage": "3"})
    for needle in ("forward", "backward", "optimizer", "ZeRO 0", "ZeRO 3"):
        assert needle in dst.DeepSpeedTrainer.notes


def test_ds_config():
    run_cfg = RunConfig(workload=dataclasses.replace(ADAM, global_batch_size=9),
                        trainer=DS, world_size=2)
    cfg = dst.ds_config(run_cfg, world_size=2, zero_stage=1)
    assert cfg["optimizer"] == {"type": "Adam", "params": {
        "lr": 1e-3, "torch_adam": True, "adam_w_mode": False, "foreach": False}}
    # every trainer's dense buckets: the workload's dense_bucket_mb (4 MiB) in fp32 elements
    assert cfg["zero_optimization"] == {"stage": 1, "reduce_bucket_size": 4 * 2**20 // 4}
    assert cfg["train_micro_batch_size_per_gpu"] == 5  # ceil(9 / 2): nominal
    assert cfg["gradient_accumulation_steps"] == 1
    assert cfg["gradient_clipping"] == 0.0
    assert not cfg["fp16"]["enabled"] and not cfg["bf16"]["enabled"]
    assert cfg["gradient_allreduce_op"] == "mean" and cfg["prescale_gradients"] is False
    assert cfg["zero_allow_untested_optimizer"] is False
    sgd = dst.ds_config(dataclasses.replace(run_cfg, workload=SGD), 2, 2)
    assert sgd["optimizer"]["type"] == "SGD" and sgd["zero_allow_untested_optimizer"] is True
    ada = dst.ds_config(dataclasses.replace(run_cfg, workload=dataclasses.replace(
        tiny(), optimizer="adagrad")), 2, 2)
    assert ada["optimizer"]["type"] == "Adagrad"
