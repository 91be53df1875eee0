"""Per-part optimizers (`optimizer.tables`, `optimizer.dense`): how they are set and stored,
row-wise Adagrad's arithmetic, and every sharded table optimizer stepping its rows exactly
as torch's optimizer steps the whole replicated table (one process, two shards)."""
from __future__ import annotations

import pytest
import torch
from reference_optimizers import torch_optimizer

from fsbench.config import ConfigError, TABLE_OPTIMIZERS
from fsbench.config_io import override_all, to_dict, workload_from_dict
from fsbench.models import table_specs
from fsbench.training.rowwise_adagrad import EPS, RowwiseAdagrad
from fsbench.workloads.presets import WORKLOADS, tiny
from freescale_impl.sharded_tables import LocalShard, RowLayout


def test_optimizer_and_lr_still_set_both_parts_and_each_part_can_differ():
    both = override_all(tiny(), [("optimizer", "sgd"), ("lr", "0.5")])
    assert (both.table_optimizer, both.table_lr, both.dense_optimizer, both.dense_lr) == ("sgd", 0.5, "sgd", 0.5)
    parts = override_all(tiny(), [("optimizer.tables", "sparse_adam"), ("optimizer.dense_lr", "0.002")])
    assert (parts.table_optimizer, parts.table_lr) == ("sparse_adam", 0.01)  # lr: the preset's
    assert (parts.dense_optimizer, parts.dense_lr) == ("adagrad", 0.002)
    # what the parts override stays as given: `optimizer` is still the preset's
    assert (parts.optimizer, parts.lr) == ("adagrad", 0.01)


def test_stored_workloads_without_parts_read_back_unchanged():
    for make in WORKLOADS.values():
        w = make()
        stored = to_dict(w)
        stored.pop("optimizer_parts")  # as every run stored before the parts existed
        assert workload_from_dict(stored) == w
        assert (w.table_optimizer, w.dense_optimizer) == (w.optimizer, w.optimizer)
    w = override_all(tiny(), [("optimizer.tables", "adam"), ("optimizer.tables_lr", "0.001")])
    assert workload_from_dict(to_dict(w)) == w


@pytest.mark.parametrize("key, value, message", [
    ("optimizer.tables", "adamw", "optimizer.tables='adamw' is not allowed; choose one of: "
     "adagrad, rowwise_adagrad, adam, sparse_adam, sgd"),
    ("optimizer.dense", "rowwise_adagrad", "optimizer.dense='rowwise_adagrad' is not allowed"),
    ("optimizer.dense_lr", "-1", "optimizer.dense_lr=-1.0 must be > 0"),
    ("optimizer.tables_lr", "fast", "--set optimizer.tables_lr='fast': expected a finite number"),
    ("optimizer", "sparse_adam", "optimizer='sparse_adam' is not allowed; choose one of: adam, sgd, adagrad"),
])
def test_bad_optimizer_settings_name_the_field_and_the_allowed_values(key, value, message):
    with pytest.raises(ConfigError) as e:
        override_all(tiny(), [(key, value)])
    assert message in str(e.value) and "\n" not in str(e.value)


def test_rowwise_adagrad_is_its_formula_and_leaves_unread_rows_alone():
    torch.manual_seed(0)
    table = torch.nn.Parameter(torch.randn(5, 3))
    start = table.detach().clone()
    opt = RowwiseAdagrad([table], lr=0.1)
    acc = torch.zeros(5, dtype=torch.float64)
    want = start.double()
    for _ in range(3):
        grad = torch.randn(5, 3)
        grad[2] = 0.0  # a row no sample read
        table.grad = grad
        opt.step()
        g = grad.double()
        acc += (g * g).mean(dim=1)
        want = want - 0.1 * g / (acc.sqrt() + EPS).unsqueeze(1)
    assert torch.allclose(table.detach().double(), want, rtol=1e-6, atol=1e-7)
    assert torch.equal(table.detach()[2], start[2])
    assert opt.state[table]["sum_sq"].shape == (5,)  # one accumulator per row


@pytest.mark.parametrize("layout_kind", ["row", "table"])
@pytest.mark.parametrize("optimizer", TABLE_OPTIMIZERS)
def test_each_shard_steps_as_torch_steps_the_whole_table(optimizer, layout_kind):
    """Four steps; each reads a few rows, some twice (their contributions sum), and leaves
    others unread, rows read before among them: dense Adam moves those, the rest not."""
    specs = table_specs(4, 40, 10, (6,))
    layout = RowLayout(specs, 2, layout_kind)
    shards = [LocalShard(layout, r, seed=1, optimizer=optimizer, lr=0.05, device=torch.device("cpu"))
              for r in range(2)]
    full = torch.empty(layout.num_rows, 4)
    for shard in shards:
        full[layout.owned_rows(shard.rank)] = shard.weight
    full.requires_grad_(True)
    reference = torch_optimizer(optimizer, [full], 0.05)
    gen = torch.Generator().manual_seed(3)
    moved_unread = False
    for step in range(4):
        rows = torch.randint(0, layout.num_rows, (12,), generator=gen)
        rows[-1] = rows[0]  # one row read twice
        grads = torch.randn(12, 4, generator=gen)
        before = full.detach().clone()
        dense = torch.zeros(layout.num_rows, 4).index_add_(0, rows, grads)
        if optimizer == "sparse_adam":
            uniq, inverse = torch.unique(rows, return_inverse=True)
            full.grad = torch.sparse_coo_tensor(
                uniq.unsqueeze(0), torch.zeros(len(uniq), 4).index_add_(0, inverse, grads), full.shape,
                check_invariants=True)
        else:
            full.grad = dense
        reference.step()
        for shard in shards:
            mine = layout.owner(rows) == shard.rank
            shard.apply_gradients(layout.local_index(rows[mine]), grads[mine])
        for shard in shards:
            assert torch.equal(shard.weight, full.detach()[layout.owned_rows(shard.rank)]), step
        unread = torch.ones(layout.num_rows, dtype=torch.bool)
        unread[rows] = False
        moved_unread |= bool((full.detach()[unread] != before[unread]).any())
    assert moved_unread == (optimizer == "adam")
    assert shards[0].steps_every_row == (optimizer == "adam")


def test_replicated_tables_take_sparse_gradients_only_for_sparse_adam():
    from fsbench.models import build_model
    from fsbench.training.optim import make_model_optimizer
    from fsbench.workloads import make_batch_source

    for tables, sparse in (("sparse_adam", True), ("adam", False), ("rowwise_adagrad", False)):
        w = override_all(tiny(), [("optimizer.tables", tables), ("optimizer.dense", "sgd")])
        model = build_model(w, seed=0)
        opt = make_model_optimizer(model, w)
        model(make_batch_source(w, 0).global_batch(0)).backward()
        assert model.sparse.tables["item"].weight.grad.is_sparse == sparse
        kinds = sorted(type(o).__name__ for o in opt.parts)
        assert kinds == sorted(["SGD", {"sparse_adam": "SparseAdam", "adam": "Adam",
                                        "rowwise_adagrad": "RowwiseAdagrad"}[tables]])
        opt.step()


def test_deepspeed_and_torchrec_refuse_what_they_cannot_run_naming_what_they_can():
    from fsbench.config import RunConfig
    from fsbench.training.trainer import check_run

    def run(trainer, **parts):
        w = override_all(tiny(), [(f"optimizer.{k}", v) for k, v in parts.items()])
        return RunConfig(workload=w, trainer=trainer, world_size=2)

    for ok in (run("ddp", tables="adam"), run("freescale", tables="adam", dense="sgd"),
               run("freescale", tables="rowwise_adagrad"), run("deepspeed", tables="adagrad")):
        check_run(ok)
    check_run(run("deepspeed", tables="adam", dense="adam", tables_lr="0.1"))  # a group per part
    with pytest.raises(ConfigError, match="Adagrad takes one lr"):
        check_run(run("deepspeed", tables_lr="0.1"))
    with pytest.raises(ConfigError, match="must be the same one of adam, adagrad, sgd"):
        check_run(run("deepspeed", dense="adam"))
    with pytest.raises(ConfigError, match="optimizer.tables=rowwise_adagrad and optimizer.dense="):
        check_run(run("deepspeed", tables="rowwise_adagrad", dense="adagrad"))
    pytest.importorskip("torchrec")
    with pytest.raises(ConfigError, match=r"torchrec trainer runs sgd, adagrad, rowwise_adagrad on cpu"):
        check_run(run("torchrec", tables="sparse_adam"))
    check_run(run("torchrec", tables="sgd", dense="adam"))


def test_a_resumed_sweep_finds_runs_stored_before_the_parts_existed(tmp_path):
    """Their stored config lacks `optimizer_parts`; read back it is today's config."""
    import json

    from fsbench.config import RunConfig
    from fsbench.running.runner import finished_runs

    run = RunConfig(workload=tiny(), trainer="ddp", world_size=2)
    stored = to_dict(run)
    del stored["workload"]["optimizer_parts"]
    (tmp_path / "old-run").mkdir()
    (tmp_path / "old-run" / "manifest.json").write_text(
        json.dumps({"status": "complete", "repeat": 0, "config": stored}))
    (tmp_path / "old-run" / "summary.json").write_text("{}")
    assert (json.dumps(to_dict(run), sort_keys=True), 0) in finished_runs(tmp_path)
