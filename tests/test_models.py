"""Reference models: jagged execution is exact, padding is invisible, slices add up.

Equivalence checks run in float64 so a real bug is never hidden by rounding noise.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fsbench.config import ModelConfig, WorkloadConfig
from fsbench.models import (Bucketing, RecModel, assemble_lookups, build_model,
                            initial_table_weight, table_ids)
from fsbench.models.loss import sampled_softmax_token_losses
from fsbench.workloads.batch import JaggedBatch

FAMILIES = ("hstu", "sasrec")
ITEMS, USERS, CONTEXTS = 40, 11, (7, 5)  # few items: negatives often equal a target
MAX_LEN = 64


def workload(family: str, max_seq_len: int = MAX_LEN) -> WorkloadConfig:
    return WorkloadConfig(name="test", model=ModelConfig(family=family, dim=16, num_layers=2,
                                                         num_heads=2),
                          item_vocab=ITEMS, user_vocab=USERS, context_vocabs=CONTEXTS,
                          max_seq_len=max_seq_len)


def make_model(family: str, seed: int = 0, dropout: float = 0.0) -> RecModel:
    """A float64 model; HSTU's zero-initialized position bias is randomized so the tests
    exercise it."""
    w = workload(family)
    w = dataclasses.replace(w, model=dataclasses.replace(w.model, dropout=dropout))
    model = build_model(w, seed).double()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("rel_pos_bias"):
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def make_batch(lengths: list[int], seed: int = 0, num_negatives: int = 8) -> JaggedBatch:
    g = torch.Generator().manual_seed(seed)
    n, b = sum(lengths), len(lengths)
    return JaggedBatch(
        item_ids=torch.randint(1, ITEMS, (n,), generator=g),
        targets=torch.randint(1, ITEMS, (n,), generator=g),
        lengths=torch.tensor(lengths, dtype=torch.int64),
        user_ids=torch.randint(1, USERS, (b,), generator=g),
        context_ids=torch.stack([torch.randint(1, v, (b,), generator=g) for v in CONTEXTS], 1),
        negative_ids=torch.randint(1, ITEMS, (num_negatives,), generator=g),
        global_num_targets=n,
    )


def encode(model: RecModel, batch: JaggedBatch) -> torch.Tensor:
    return model.dense.encode(model.sparse.lookup(batch), batch)


def loss_and_grads(model: RecModel, batch: JaggedBatch) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    loss = model(batch)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def assert_rel_close(actual: torch.Tensor, expected: torch.Tensor, tol: float = 1e-9) -> None:
    actual, expected = actual.detach(), expected.detach()
    err = float((actual - expected).norm() / expected.norm().clamp_min(1e-30))
    assert err <= tol, f"relative error {err:.3g} > {tol}"


def assert_grads_close(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        if expected[name].norm() == 0:  # e.g. the item padding row's gradient
            assert actual[name].norm() == 0, name
        else:
            assert_rel_close(actual[name], expected[name])


def sample_tokens(batch: JaggedBatch, i: int) -> slice:
    start = int(batch.offsets[i])
    return slice(start, start + int(batch.lengths[i]))


LENGTHS = [5, 1, 17, 9, 33, 2, 64, 12, 40, 16]


# (a) jagged execution == each sample alone, unpadded --------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_jagged_batch_matches_each_sample_run_alone_without_padding(family):
    model, batch = make_model(family), make_batch(LENGTHS)
    hidden = encode(model, batch)
    loss, grads = loss_and_grads(model, batch)
    assert model.dense.layout(batch).padded_tokens > batch.num_targets  # padding is in play

    model.dense.bucketing = Bucketing.exact()
    ref_loss, ref_grads = torch.zeros((), dtype=torch.float64), None
    for i in range(batch.batch_size):
        one = batch.select([i])
        assert model.dense.layout(one).padded_tokens == one.num_targets
        assert_rel_close(hidden[sample_tokens(batch, i)], encode(model, one))
        one_loss, one_grads = loss_and_grads(model, one)
        ref_loss += one_loss
        ref_grads = one_grads if ref_grads is None else {
            n: ref_grads[n] + one_grads[n] for n in one_grads}
    assert_rel_close(loss, ref_loss)
    assert_grads_close(grads, ref_grads)


def test_hstu_block_matches_paper_formula_on_padded_buckets():
    model, batch = make_model("hstu"), make_batch([3, 6, 13, 21])  # buckets 8, 16, 24
    block, dim, heads = model.dense.blocks[0], 16, 2
    x = torch.randn(batch.num_targets, dim, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(3))
    out = block(x, model.dense.layout(batch))
    for i, n in enumerate(batch.lengths.tolist()):
        xs = x[sample_tokens(batch, i)]
        u, v, q, k = F.silu(block.uvqk(block.norm_in(xs))).split(dim, dim=-1)
        dist = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).clamp_min(0)
        heads_out = []
        for h in range(heads):
            cols = slice(h * dim // heads, (h + 1) * dim // heads)
            scores = q[:, cols] @ k[:, cols].T + block.rel_pos_bias[h][dist]
            weights = F.silu(scores) * torch.ones(n, n).tril() / n
            heads_out.append(weights @ v[:, cols])
        expected = xs + block.out(block.norm_attn(torch.cat(heads_out, 1)) * u)
        assert_rel_close(out[sample_tokens(batch, i)], expected)


def test_sasrec_block_matches_textbook_formula_on_padded_buckets():
    model, batch = make_model("sasrec"), make_batch([3, 6, 13, 21])
    block, dim, heads = model.dense.blocks[0], 16, 2
    x = torch.randn(batch.num_targets, dim, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(3))
    out = block(x, model.dense.layout(batch))
    for i, n in enumerate(batch.lengths.tolist()):
        xs = x[sample_tokens(batch, i)]
        q, k, v = block.qkv(block.norm_attn(xs)).split(dim, dim=-1)
        future = torch.ones(n, n, dtype=torch.bool).triu(1)
        heads_out = []
        for h in range(heads):
            cols = slice(h * dim // heads, (h + 1) * dim // heads)
            scores = (q[:, cols] @ k[:, cols].T / math.sqrt(dim // heads)).masked_fill(
                future, float("-inf"))
            heads_out.append(scores.softmax(-1) @ v[:, cols])
        h1 = xs + block.proj(torch.cat(heads_out, 1))
        expected = h1 + block.ffn_out(F.gelu(block.ffn_in(block.norm_ffn(h1))))
        assert_rel_close(out[sample_tokens(batch, i)], expected)


# (b) padding never changes a result ------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_adding_a_long_sample_leaves_other_samples_outputs_unchanged(family):
    model = make_model(family)
    with_long = make_batch([3, 9, 64, 14, 60])  # 60 shares the long sample's bucket
    without = with_long.select([0, 1, 3, 4])
    hidden_with, hidden_without = encode(model, with_long), encode(model, without)
    for j, i in enumerate([0, 1, 3, 4]):
        assert_rel_close(hidden_without[sample_tokens(without, j)],
                         hidden_with[sample_tokens(with_long, i)])


@pytest.mark.parametrize("family", FAMILIES)
def test_bucketing_granularity_does_not_change_loss_or_grads(family):
    model, batch = make_model(family), make_batch(LENGTHS)
    loss, grads = loss_and_grads(model, batch)
    for bucketing in (Bucketing.exact(), Bucketing(step=32, linear_until=32, per_octave=1),
                      Bucketing(step=MAX_LEN)):  # the last pads everything to one length
        model.dense.bucketing = bucketing
        other_loss, other_grads = loss_and_grads(model, batch)
        assert_rel_close(other_loss, loss)
        assert_grads_close(other_grads, grads)


# (c) disjoint slices add up to the global batch -----------------------------------------

def assert_slices_sum_to_the_batch(model: RecModel, batch: JaggedBatch, parts) -> tuple[torch.Tensor, dict]:
    """The losses and gradients of the batch's disjoint `parts` sum to the batch's own;
    returns the batch's (loss, grads)."""
    loss, grads = loss_and_grads(model, batch)
    total, summed = torch.zeros((), dtype=torch.float64), None
    for part in parts:
        part_loss, part_grads = loss_and_grads(model, batch.select(part))
        total += part_loss
        summed = part_grads if summed is None else {n: summed[n] + part_grads[n] for n in grads}
    assert_rel_close(total, loss)
    assert_grads_close(summed, grads)
    return loss, grads


@pytest.mark.parametrize("family", FAMILIES)
def test_disjoint_slices_sum_to_full_batch_loss_and_grads(family):
    assert_slices_sum_to_the_batch(make_model(family), make_batch(LENGTHS),
                                   ([6, 0, 3], [9, 1], [2, 4, 5, 7, 8]))


@pytest.mark.parametrize("family", FAMILIES)
def test_dropout_is_drawn_by_token_so_slices_still_sum_to_the_full_batch(family):
    """With dropout, losses and gradients of disjoint slices, in any order, still sum to
    the full batch's (a token's mask does not depend on its batch-mates), while dropout
    does change the loss, changes it again at another step, and is off in eval mode."""
    model, batch = make_model(family, dropout=0.3), make_batch(LENGTHS)
    loss, _ = assert_slices_sum_to_the_batch(model, batch, ([6, 0, 3], [9, 1], [8, 2, 7, 5, 4]))
    without, _ = loss_and_grads(make_model(family), batch)
    later, _ = loss_and_grads(model, dataclasses.replace(batch, step=1))
    assert abs(loss.item() - without.item()) > 1e-6 and abs(later.item() - loss.item()) > 1e-6
    model.eval()
    assert_rel_close(loss_and_grads(model, batch)[0], without)


def test_keyed_dropout_drops_about_p_and_rescales_the_rest():
    from fsbench.models.dropout import KeyedDropout, token_keys

    t = torch.arange(4000)
    keys = token_keys(3, torch.arange(40), t % 40, t // 40, t % 97, t % 89)
    out = KeyedDropout(0.25, keys)(torch.ones(4000, 16, dtype=torch.float64), site=2)
    kept = out != 0
    assert 0.24 < 1 - kept.double().mean().item() < 0.26
    assert torch.all(out[kept] == 1 / 0.75)
    assert torch.equal(KeyedDropout(0.25, keys)(out, site=2) != 0, kept)  # same mask
    assert not torch.equal(KeyedDropout(0.25, keys)(out, site=3) != 0, kept)


def test_dropout_outside_its_range_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="model.dropout"):
        ModelConfig(dropout=1.0)


@pytest.mark.parametrize("family", FAMILIES)
def test_empty_slice_gives_zero_loss_and_zero_grads_for_every_parameter(family):
    model = make_model(family)
    loss, grads = loss_and_grads(model, make_batch(LENGTHS).select([]))
    assert loss.item() == 0.0
    assert all(g.norm() == 0 for g in grads.values())  # present (DDP needs them), all zero


# (d) sampled softmax ----------------------------------------------------------------------

def test_negative_equal_to_target_is_masked_out_of_the_softmax():
    g = torch.Generator().manual_seed(0)
    hidden, targets, negatives = (torch.randn(n, 4, generator=g, dtype=torch.float64)
                                  for n in (3, 3, 3))
    target_ids, negative_ids = torch.tensor([7, 8, 9]), torch.tensor([7, 20, 21])
    losses = sampled_softmax_token_losses(hidden, targets, negatives, target_ids, negative_ids)

    def ce(h, pos, negs):  # cross-entropy with the positive at index 0
        logits = torch.cat([(h * pos).sum()[None], negs @ h])
        return torch.logsumexp(logits, 0) - logits[0]

    # token 0's target is negative 0: that negative is dropped; the others keep all three
    assert_rel_close(losses[0], ce(hidden[0], targets[0], negatives[1:]))
    for t in (1, 2):
        assert_rel_close(losses[t], ce(hidden[t], targets[t], negatives))


# (e) deterministic initialization --------------------------------------------------------

def test_build_model_same_seed_same_weights_different_seed_differs_global_rng_untouched():
    rng_before = torch.random.get_rng_state()
    a, b, c = (build_model(workload("hstu"), seed) for seed in (5, 5, 6))
    assert torch.equal(rng_before, torch.random.get_rng_state())
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
        if pa.std() > 0:  # LayerNorm, biases and the HSTU position bias start constant
            assert not torch.equal(pa, pc), name
    assert a.sparse.tables["item"].weight[0].norm() == 0  # padding row


def test_tables_depend_only_on_seed_and_name_so_sharded_copies_can_rebuild_them():
    hstu, sasrec = build_model(workload("hstu"), 3), build_model(workload("sasrec"), 3)
    for spec in hstu.sparse.specs:
        expected = initial_table_weight(spec, seed=3)
        assert torch.equal(hstu.sparse.tables[spec.name].weight, expected)
        assert torch.equal(sasrec.sparse.tables[spec.name].weight, expected)


def test_lookup_rows_are_table_rows_indexed_by_id():
    model, batch = make_model("hstu"), make_batch(LENGTHS)
    lookups = model.sparse.lookup(batch)
    tables = {name: t.weight for name, t in model.sparse.tables.items()}
    assert torch.equal(lookups.items, tables["item"][batch.item_ids])
    assert torch.equal(lookups.targets, tables["item"][batch.targets])
    assert torch.equal(lookups.negatives, tables["item"][batch.negative_ids])
    assert torch.equal(lookups.users, tables["user"][batch.user_ids])
    for i in range(len(CONTEXTS)):
        assert torch.equal(lookups.contexts[:, i], tables[f"context_{i}"][batch.context_ids[:, i]])
    # what a sharded implementation does: fetch rows by id elsewhere, then assemble
    rows = {name: tables[name][ids] for name, ids in table_ids(batch).items()}
    assert torch.equal(assemble_lookups(batch, rows).items, lookups.items)


# (f) cost follows each sample's own length ------------------------------------------------

def test_short_samples_are_not_padded_to_the_long_one():
    model = build_model(workload("sasrec", max_seq_len=200), 0)
    batch = make_batch([16] * 8 + [200])
    layout = model.dense.layout(batch)
    assert {(b.padded_len, b.num_samples) for b in layout.buckets} == {(16, 8), (224, 1)}
    assert layout.padded_tokens == 8 * 16 + 224  # not 9 * 200
    assert layout.padded_tokens <= 1.25 * batch.num_targets + 8 * batch.batch_size


def test_padded_length_is_within_25_percent_or_one_step_and_buckets_are_few():
    bucketing = Bucketing()
    padded = [bucketing.padded_length(n) for n in range(1, 1025)]
    assert all(n <= p <= max(n + 7, 1.25 * n) for n, p in zip(range(1, 1025), padded))
    assert len(set(padded[:200])) == 15  # 8 up to 64, 4 in (64, 128], 3 cover (128, 200]


def test_padded_lengths_of_a_batch_are_each_lengths_own():
    lengths = np.arange(1, 5000)
    for bucketing in (Bucketing(), Bucketing.exact(), Bucketing(step=32, linear_until=32, per_octave=1)):
        assert bucketing.padded_lengths(lengths).tolist() == [bucketing.padded_length(int(n)) for n in lengths]


def test_each_sample_lands_in_the_bucket_of_its_own_length():
    batch = make_batch([1, 7, 8, 9, 63, 64, 65, 100, 129, 3, 64])
    bucketing = Bucketing()
    layout = build_model(workload("hstu", max_seq_len=200), 0).dense.layout(batch)
    for bucket in layout.buckets:
        tokens = layout.order[bucket.start:bucket.end]
        member_lengths = layout.length[tokens].unique().tolist()
        assert all(bucketing.padded_length(n) == bucket.padded_len for n in member_lengths)
        assert bucket.num_samples == len(set(layout.sample[tokens].tolist()))


def test_sample_longer_than_max_seq_len_is_rejected():
    model = build_model(workload("hstu", max_seq_len=8), 0)
    with pytest.raises(ValueError, match="max_seq_len=8"):
        model(make_batch([3, 9]))


def test_materialize_allocates_every_parameter_and_keeps_shared_ones_shared():
    from torch import nn

    from fsbench.models.init import materialize

    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 4))
        model[1].weight = nn.Parameter(model[0].weight.t())  # a distinct parameter
        extra = nn.Linear(4, 3)
        extra.weight = model[0].weight  # tied to model[0]
        both = nn.ModuleList([model, extra])
    materialize(both)
    assert all(p.device.type == "cpu" for p in both.parameters())
    assert extra.weight is model[0].weight and model[1].weight is not model[0].weight
    assert len(list(both.parameters())) == 5  # 2 weights + 2 biases of model, extra's bias


def test_rows_narrower_than_the_model_are_projected_in_and_out():
    """model.table_dim: tables of that width, the items projected up to the model's width
    and its output down to the rows' for the loss; the FLOPs and the fit's key say so."""
    import dataclasses as dc

    from fsbench.costmodel.fit import model_key
    from fsbench.models import build_model
    from fsbench.scaling.sim_costs import encoder_flops
    from fsbench.workloads.generator import SyntheticBatches
    from fsbench.workloads.presets import tiny

    base = tiny()
    narrow = dc.replace(base, model=dc.replace(base.model, table_dim=8))
    model = build_model(narrow, seed=0)
    assert {t.weight.shape[1] for t in model.sparse.tables.values()} == {8}
    assert model.dense.rows_in.weight.shape == (base.model.dim, 8)
    loss = model(SyntheticBatches(narrow, 0).global_batch(0))
    loss.backward()
    assert torch.isfinite(loss) and model.dense.rows_out.weight.grad is not None
    assert build_model(base, seed=0).dense.rows_in is None  # the same width: no projection
    L = np.array([10.0])
    extra = encoder_flops(narrow, L) - encoder_flops(base, L)
    d, negs = base.model.dim, base.negatives_per_step
    assert extra == pytest.approx(3 * (4 * 8 * d * 10 + 2 * (1 + negs) * (8 - d) * 10))
    assert model_key(narrow) != model_key(base) and "-t8-" in model_key(narrow)
