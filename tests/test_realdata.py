"""Real-data loaders: three file formats into one history table, then batches that are
pure in (seed, step) and keep each user's most recent items."""
import dataclasses
import json

import numpy as np
import pytest
import torch

from fsbench.config import ConfigError, ModelConfig, WorkloadConfig
from fsbench.workloads import (
    DataSpec,
    RealDataBatches,
    load_histories,
    make_batch_source,
    parse_data_spec,
)
from fsbench.workloads.realdata import context_ids_for_users

# Three users with sparse ids, interleaved, in chronological order:
# user 30 sees items 7, 5, 9, 5; user 10 sees 5, 8; user 20 sees only 9 (too short).
EVENTS = [  # (user, item, time)
    (30, 7, 100), (10, 5, 50), (30, 5, 200), (20, 9, 10), (30, 9, 300), (10, 8, 60),
    (30, 5, 400),
]


def write_sasrec(path):
    path.write_text("".join(f"{u} {i}\n" for u, i, _ in EVENTS))


def write_recbole(path):
    # Newest first: only the timestamp column can restore the chronology.
    rows = sorted(EVENTS, key=lambda e: -e[2])
    path.write_text("user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
                    + "".join(f"u{u}\ti{i}\t4.0\t{t}\n" for u, i, t in rows))


def write_otto(path):
    sessions = {}
    for u, i, t in EVENTS:
        sessions.setdefault(u, []).append({"aid": i, "ts": t, "type": "clicks"})
    # Events newest first: only their ts can restore the chronology.
    path.write_text("".join(json.dumps({"session": u, "events": ev[::-1]}) + "\n"
                            for u, ev in sessions.items()))


WRITERS = {"sasrec": write_sasrec, "recbole": write_recbole, "otto": write_otto}


@pytest.fixture(params=sorted(WRITERS))
def dataset(request, tmp_path):
    """(data spec, kind) for a fixture file of each format holding EVENTS."""
    kind = request.param
    path = tmp_path / f"data.{kind}"
    WRITERS[kind](path)
    return f"{kind}:{path}", kind


def workload(data: str, **kw) -> WorkloadConfig:
    base = dict(name="t", item_vocab=10, user_vocab=10, context_vocabs=(5, 2),
                max_seq_len=50, global_batch_size=4, num_negatives=8, data=data)
    return WorkloadConfig(**(base | kw))


def test_each_format_loads_chronological_histories_with_contiguous_ids(dataset):
    """Keys are remapped in sorted order (users 10, 20, 30 -> 1, 2, 3; items 5, 7, 8, 9
    -> 1..4, and likewise for RecBole's string tokens); each history is oldest first even
    though the RecBole and OTTO fixtures list events newest first."""
    h = load_histories(dataset[0])
    assert (h.num_users, h.num_items) == (3, 4) and h.items.dtype == np.int64
    assert [h.history(u).tolist() for u in (1, 2, 3)] == [[1, 3], [4], [2, 1, 4, 1]]


def test_recbole_orders_by_timestamp_and_without_one_keeps_file_order(tmp_path):
    path = tmp_path / "x.inter"
    path.write_text("user_id:token\titem_id:token\ttimestamp:float\n"
                    "a\tz\t3\na\tx\t1\na\ty\t2\n")
    assert load_histories(f"recbole:{path}").history(1).tolist() == [1, 2, 3]  # x, y, z
    path.write_text("user_id:token\titem_id:token\n" "a\tz\na\tx\na\ty\n")
    assert load_histories(f"recbole:{path}").history(1).tolist() == [3, 1, 2]  # z, x, y


def test_batches_are_valid_and_deterministic_in_seed_and_step(dataset):
    spec, _ = dataset
    w = workload(spec)
    h = load_histories(spec)
    a, b = RealDataBatches(w, 5, h), RealDataBatches(w, 5, load_histories(spec))
    a.global_batch(9)
    for step in (0, 1, 2):
        x, y = a.global_batch(step), b.global_batch(step)
        for name in ("item_ids", "targets", "lengths", "user_ids", "context_ids",
                     "negative_ids"):
            assert torch.equal(getattr(x, name), getattr(y, name))
            assert getattr(x, name).dtype == torch.int64
        assert x.step == step and x.global_num_targets == int(x.lengths.sum())
        assert x.batch_size == w.global_batch_size
        assert x.context_ids.shape == (w.global_batch_size, 2)
        assert int(x.context_ids.min()) >= 1
        assert int(x.negative_ids.min()) >= 1 and int(x.negative_ids.max()) <= h.num_items
        # Only users with >= 2 interactions; the sample is a window of the history.
        for u, s, e in zip(x.user_ids.tolist(), x.offsets[:-1].tolist(),
                           x.offsets[1:].tolist()):
            hist = h.history(u).tolist()
            assert len(hist) >= 2
            assert x.item_ids[s:e].tolist() == hist[:-1]
            assert x.targets[s:e].tolist() == hist[1:]
    user_draws = {tuple(a.global_batch(s).user_ids.tolist()) for s in range(20)}
    assert len(user_draws) > 1
    other_seed = RealDataBatches(w, 6, h)
    assert any(not torch.equal(other_seed.global_batch(s).user_ids, a.global_batch(s).user_ids)
               for s in range(10))


def test_window_keeps_the_most_recent_max_seq_len_plus_1_items(tmp_path):
    path = tmp_path / "x.txt"
    # user 1 has 2 items, user 2 has items 1..10 in order, user 3 has 1 item (ineligible).
    path.write_text("1 3\n1 4\n" + "".join(f"2 {i}\n" for i in range(1, 11)) + "3 5\n")
    w = workload(f"sasrec:{path}", item_vocab=11, max_seq_len=3, global_batch_size=2)
    b = make_batch_source(w, seed=0).global_batch(0)
    users = b.user_ids.tolist()
    assert sorted(users) == [1, 2]  # the two eligible users, each once
    long, short = b.select([users.index(2)]), b.select([users.index(1)])
    assert long.item_ids.tolist() == [7, 8, 9] and long.targets.tolist() == [8, 9, 10]
    assert short.item_ids.tolist() == [3] and short.targets.tolist() == [4]


def test_users_with_one_interaction_are_never_sampled(dataset):
    spec, _ = dataset
    source = make_batch_source(workload(spec, global_batch_size=16), seed=0)
    assert isinstance(source, RealDataBatches)
    short_user = int(np.flatnonzero(source.histories.lengths == 1)[0]) + 1
    for step in range(5):
        assert short_user not in source.global_batch(step).user_ids.tolist()


def test_context_ids_are_a_fixed_nonzero_hash_of_the_user():
    users = np.arange(1, 5001)
    ctx = context_ids_for_users(users, (2, 3, 1000))
    assert ctx.dtype == np.int64 and ctx.shape == (5000, 3)
    assert (ctx[:, 0] == 1).all()
    assert set(np.unique(ctx[:, 1])) == {1, 2}
    assert 1 <= ctx[:, 2].min() and ctx[:, 2].max() <= 999 and len(np.unique(ctx[:, 2])) > 900
    np.testing.assert_array_equal(context_ids_for_users(users[::-1], (2, 3, 1000)), ctx[::-1])


def test_sampled_negatives_are_uniform_and_full_takes_every_item(tmp_path):
    """Popularity-drawn negatives without a correction teach the logit log p - log q
    (rare items first); uniform ones teach log p up to a constant. On a file where item
    1 is 9 times as popular as item 2, the negatives are drawn half and half."""
    path = tmp_path / "x.txt"
    path.write_text("".join(f"{u} 1\n" for u in range(90)) + "".join(f"{u} 2\n" for u in range(10)))
    w = workload(f"sasrec:{path}", user_vocab=101, item_vocab=3, num_negatives=20_000)
    neg = make_batch_source(w, 0).global_batch(0).negative_ids
    assert set(neg.tolist()) == {1, 2}
    assert float((neg == 1).double().mean()) == pytest.approx(0.5, abs=0.02)
    full = workload(f"sasrec:{path}", user_vocab=101, item_vocab=3,
                    model=ModelConfig(loss="full"))
    assert make_batch_source(full, 0).global_batch(0).negative_ids.tolist() == [1, 2]
    assert full.negatives_per_step == 2 and w.negatives_per_step == 20_000


def test_epochs_train_every_target_once_per_epoch(tmp_path):
    """data_order=epochs: over one epoch's steps every (input window, target) of the
    training histories comes exactly once (bar the dropped partial batch), each target
    with the items before it in its history as inputs, and the next epoch reshuffles."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 40, 30)
    lines = [f"{u} {i}" for u, n in enumerate(lengths) for i in rng.integers(0, 25, n)]
    path = tmp_path / "x.txt"
    path.write_text("\n".join(lines) + "\n")
    w = workload(f"sasrec:{path}", user_vocab=31, item_vocab=26, max_seq_len=7,
                 global_batch_size=5, data_order="epochs")
    source = make_batch_source(w, 0, held_out=2)
    h = source.histories
    assert h.lengths.tolist() == np.maximum(lengths - 2, 0).tolist()
    spe = source.steps_per_epoch
    windows = sum(-(-(n - 1) // 7) for n in h.lengths if n >= 2)
    assert spe == windows // 5 >= 2
    seen = []
    for step in range(spe):
        b = source.global_batch(step)
        assert b.batch_size == 5 and int(b.lengths.max()) <= 7
        for u, s, e in zip(b.user_ids.tolist(), b.offsets[:-1].tolist(), b.offsets[1:].tolist()):
            hist = h.history(u).tolist()
            inputs, targets = b.item_ids[s:e].tolist(), b.targets[s:e].tolist()
            # a contiguous stretch of the history: inputs, and each input's next item
            start = next(i for i in range(len(hist)) if hist[i:i + len(inputs)] == inputs
                         and hist[i + 1:i + 1 + len(targets)] == targets)
            seen += [(u, start + 1 + j) for j in range(len(targets))]
    assert len(seen) == len(set(seen))  # no target twice in an epoch
    dropped = windows - spe * 5
    all_targets = {(u, p) for u in range(1, h.num_users + 1) for p in range(1, int(h.lengths[u - 1]))}
    assert set(seen) <= all_targets and len(all_targets - set(seen)) <= dropped * 7
    first = [source.global_batch(k).user_ids.tolist() for k in range(spe)]
    second = [source.global_batch(spe + k).user_ids.tolist() for k in range(spe)]
    assert first != second  # reshuffled
    with pytest.raises(ConfigError, match="data_order='epochs' orders real histories"):
        workload("synthetic", data_order="epochs")


def test_window_targets_give_every_target_its_history_once_per_epoch(tmp_path):
    """window_targets=3 of max_seq_len=7: each window trains its last 3 targets (the
    others are 0: context only), each trained target sees its whole history or at least
    5 items of it, and every target comes once per epoch (bar the dropped partial batch)."""
    rng = np.random.default_rng(4)
    lengths = rng.integers(1, 30, 25)
    lines = [f"{u} {i}" for u, n in enumerate(lengths) for i in rng.integers(0, 25, n)]
    path = tmp_path / "x.txt"
    path.write_text("\n".join(lines) + "\n")
    w = workload(f"sasrec:{path}", user_vocab=26, item_vocab=26, max_seq_len=7,
                 global_batch_size=5, data_order="epochs", window_targets=3)
    source = make_batch_source(w, 0, held_out=1)
    h = source.histories
    windows = sum(-(-(n - 1) // 3) for n in h.lengths if n >= 2)
    assert source.steps_per_epoch == windows // 5
    seen = []
    for step in range(source.steps_per_epoch):
        b = source.global_batch(step)
        assert b.global_num_targets == int((b.targets != 0).sum())
        for u, s, e in zip(b.user_ids.tolist(), b.offsets[:-1].tolist(), b.offsets[1:].tolist()):
            hist, inputs, targets = h.history(u).tolist(), b.item_ids[s:e].tolist(), b.targets[s:e].tolist()
            trained = [j for j, t in enumerate(targets) if t != 0]
            assert trained == list(range(max(0, len(targets) - 3), len(targets)))
            start = next(i for i in range(len(hist)) if hist[i:i + len(inputs)] == inputs)
            for j in trained:
                assert targets[j] == hist[start + j + 1]
                # its whole history before it, or at least 7 - 3 + 1 items of it
                assert j + 1 == start + j + 1 or j + 1 >= 5
                seen.append((u, start + j + 1))
    assert len(seen) == len(set(seen))
    all_targets = {(u, p) for u in range(1, h.num_users + 1) for p in range(1, int(h.lengths[u - 1]))}
    assert set(seen) <= all_targets and len(all_targets - set(seen)) <= (windows % 5) * 3
    with pytest.raises(ConfigError, match="window_targets=8 must be in 0..max_seq_len=7"):
        workload(f"sasrec:{path}", max_seq_len=7, window_targets=8)


def test_context_only_positions_have_no_loss():
    """A target of 0 (window_targets' context) adds nothing to the loss or its gradients:
    the loss is the sum over the trained positions alone, over their count, and the
    padding row that the 0 targets look up gets no gradient."""
    from fsbench.models import build_model
    from fsbench.models.loss import sampled_softmax_token_losses
    from fsbench.workloads.batch import JaggedBatch

    w = workload("synthetic", item_vocab=30, max_seq_len=8, num_negatives=5)
    model = build_model(w, seed=0)
    g = torch.Generator().manual_seed(1)
    lengths = torch.tensor([5, 3, 8])
    targets = torch.randint(1, 30, (16,), generator=g)
    targets[[0, 1, 2, 5, 8, 9]] = 0
    batch = JaggedBatch(item_ids=torch.randint(1, 30, (16,), generator=g), targets=targets,
                        lengths=lengths, user_ids=torch.tensor([1, 2, 3]),
                        context_ids=torch.ones(3, 2, dtype=torch.int64),
                        negative_ids=torch.arange(1, 6), global_num_targets=10)
    assert batch.trained_per_sample().tolist() == [2, 2, 6]
    loss = model(batch)
    loss.backward()
    lookups = model.sparse.lookup(batch)
    token = sampled_softmax_token_losses(model.dense.encode(lookups, batch), lookups.targets,
                                         lookups.negatives, batch.targets, batch.negative_ids)
    assert torch.allclose(loss, token[targets != 0].sum() / 10)
    item_rows = [p for n, p in model.named_parameters() if p.grad is not None and p.shape[0] == 30]
    assert item_rows and all(float(p.grad[0].abs().max()) == 0.0 for p in item_rows)


def test_a_freescale_window_counts_only_the_trained_targets(tmp_path):
    """FreeScale's look-ahead window re-packs samples across steps; a step's global
    target count (the loss's denominator) is then its samples' trained targets, not their
    tokens, so the window trains the same loss as DDP under window_targets."""
    from freescale_impl.balance import analytical_cost
    from freescale_impl.balanced_share import BalancedShare
    from freescale_impl.trainer import FreeScaleOptions

    rng = np.random.default_rng(5)
    lengths = np.where(rng.random(40) < 0.1, 60, rng.integers(3, 12, 40))  # a few whales
    lines = [f"{u} {i}" for u, n in enumerate(lengths) for i in rng.integers(0, 25, n)]
    path = tmp_path / "x.txt"
    path.write_text("\n".join(lines) + "\n")
    w = workload(f"sasrec:{path}", user_vocab=41, item_vocab=26, max_seq_len=20,
                 global_batch_size=8, data_order="epochs", window_targets=4)
    opts = FreeScaleOptions.parse({"window": "2", "tables": "replicated"}, prefix="freescale")
    shares = [BalancedShare(make_batch_source(w, 0), r, 2, analytical_cost(w), opts, steps=6)
              for r in range(2)]
    moved = False
    for step in range(6):
        local = [share.share(step, r)[0] for r, share in enumerate(shares)]
        trained = sum(int((b.targets != 0).sum()) for b in local)
        assert all(b.global_num_targets == trained for b in local), step
        moved |= trained != make_batch_source(w, 0).global_batch(step).global_num_targets
    assert moved  # the window moved samples between steps: the count followed them


def test_too_small_vocab_tells_which_set_to_use(dataset):
    spec, _ = dataset
    with pytest.raises(ConfigError, match=r"4 items .*--set item_vocab=5"):
        make_batch_source(workload(spec, item_vocab=4), 0)
    with pytest.raises(ConfigError, match=r"3 users .*--set user_vocab=4"):
        make_batch_source(workload(spec, user_vocab=2), 0)


def test_parse_data_spec_accepts_synthetic_and_existing_files(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("1 1\n")
    assert parse_data_spec("synthetic") == DataSpec("synthetic")
    assert parse_data_spec(f"sasrec:{path}") == DataSpec("sasrec", str(path))


@pytest.mark.parametrize("spec", ["csv:/tmp/x", "sasrec", "sasrec:", "otto:/no/such/file.jsonl",
                                  "Synthetic"])
def test_bad_data_spec_raises_one_line_config_error_naming_the_field(spec):
    with pytest.raises(ConfigError) as err:
        parse_data_spec(spec)
    msg = str(err.value)
    assert msg.startswith(f"data={spec!r}") and "\n" not in msg and "recbole:PATH" in msg


def test_workload_config_rejects_a_missing_data_file(tmp_path):
    with pytest.raises(ConfigError, match="^data=.*no such file"):
        workload(f"sasrec:{tmp_path / 'absent.txt'}")


@pytest.mark.parametrize("kind,content,why", [
    ("sasrec", "1 2\n1 2 3\n", "line 2"),
    ("sasrec", "1 x\n", "line 1"),
    ("recbole", "user:token\titem:token\n", "header"),
    ("recbole", "user_id:token\titem_id:token\na\n", "line 2"),
    ("recbole", "user_id:token\titem_id:token\ttimestamp:float\na\tb\tnoon\n", "line 2"),
    ("otto", '{"session": 1, "events": [{"aid": 3}]}\n', "line 1"),
    ("otto", "not json\n", "line 1"),
    ("sasrec", "", "no interactions"),
])
def test_malformed_file_raises_config_error_naming_path_and_line(tmp_path, kind, content, why):
    path = tmp_path / f"bad.{kind}"
    path.write_text(content)
    with pytest.raises(ConfigError) as err:
        load_histories(f"{kind}:{path}")
    msg = str(err.value)
    assert msg.startswith(f"data='{kind}:") and str(path) in msg and why in msg
    assert "\n" not in msg


def test_the_synthetic_model_shares_its_loss_by_trained_targets():
    """compute=synthetic spins by tokens but, like the reference model, weighs a slice's
    loss by its trained targets over the global count: with context-only positions
    (targets 0) the slices' losses still sum to the global batch's."""
    from fsbench.models import build_model
    from fsbench.workloads.batch import JaggedBatch

    w = workload("synthetic", compute="synthetic")
    w = dataclasses.replace(w, synthetic=dataclasses.replace(w.synthetic, us_per_token=0.01))
    model = build_model(w, seed=0)
    targets = torch.tensor([0, 0, 3, 4, 0, 5, 6, 7])
    batch = JaggedBatch(item_ids=torch.ones(8, dtype=torch.int64), targets=targets,
                        lengths=torch.tensor([4, 4]), user_ids=torch.tensor([1, 2]),
                        context_ids=torch.ones(2, 2, dtype=torch.int64),
                        negative_ids=torch.arange(1, 4), global_num_targets=5)
    assert batch.num_trained == 5
    parts = [float(model(batch.select([i]))) for i in (0, 1)]
    assert parts == pytest.approx([2 / 5, 3 / 5]) and sum(parts) == pytest.approx(float(model(batch)))
