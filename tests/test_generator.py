"""Synthetic batches: a valid JaggedBatch that is a pure function of (seed, step)."""
import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from fsbench.config import ConfigError, WorkloadConfig
from fsbench.workloads import SyntheticBatches, make_batch_source
from fsbench.workloads.batch import JaggedBatch

REPO = Path(__file__).resolve().parents[1]


def workload(**kw) -> WorkloadConfig:
    base = dict(name="t", item_vocab=5_000, user_vocab=300, context_vocabs=(7, 3),
                max_seq_len=40, global_batch_size=16, num_negatives=32,
                lengths="yelp", popularity="zipf:1.0")
    return WorkloadConfig(**(base | kw))


def batch_digest(b: JaggedBatch) -> str:
    h = hashlib.sha256()
    for t in (b.item_ids, b.targets, b.lengths, b.user_ids, b.context_ids, b.negative_ids):
        h.update(str(t.dtype).encode() + str(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes())
    h.update(f"{b.global_num_targets},{b.step}".encode())
    return h.hexdigest()


def assert_same(a: JaggedBatch, b: JaggedBatch) -> None:
    assert batch_digest(a) == batch_digest(b)


def test_same_seed_and_step_give_the_identical_batch_in_a_separate_process():
    # The child reuses this module's workload() and batch_digest(), so both sides agree.
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
        from test_generator import batch_digest, workload
        from fsbench.workloads import SyntheticBatches
        print(batch_digest(SyntheticBatches(workload(), seed=11).global_batch(5)))
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    # Build ours after a different step, to show nothing carries between calls.
    source = SyntheticBatches(workload(), seed=11)
    source.global_batch(0)
    assert out.stdout.strip() == batch_digest(source.global_batch(5))


def test_batches_do_not_depend_on_call_order_or_instance():
    a = SyntheticBatches(workload(), seed=3)
    b = SyntheticBatches(workload(), seed=3)
    first = [a.global_batch(s) for s in range(4)]
    for s in (3, 1, 0, 2):
        assert_same(b.global_batch(s), first[s])


def test_different_steps_and_seeds_give_different_batches():
    digests = {batch_digest(SyntheticBatches(workload(), seed).global_batch(step))
               for seed in (0, 1) for step in range(5)}
    assert len(digests) == 10


@pytest.mark.parametrize("context_vocabs", [(7, 3), (2,), ()])
def test_batch_is_valid_next_item_prediction(context_vocabs):
    w = workload(context_vocabs=context_vocabs)
    b = SyntheticBatches(w, seed=0).global_batch(7)
    assert b.step == 7 and b.batch_size == w.global_batch_size
    for t in (b.item_ids, b.targets, b.lengths, b.user_ids, b.context_ids, b.negative_ids):
        assert t.dtype == torch.int64
    assert b.global_num_targets == b.num_targets == int(b.lengths.sum())
    assert 1 <= int(b.lengths.min()) and int(b.lengths.max()) <= w.max_seq_len
    for ids in (b.item_ids, b.targets, b.negative_ids):
        assert 1 <= int(ids.min()) and int(ids.max()) <= w.item_vocab - 1
    assert 1 <= int(b.user_ids.min()) and int(b.user_ids.max()) <= w.user_vocab - 1
    assert b.context_ids.shape == (w.global_batch_size, len(context_vocabs))
    for c, vocab in enumerate(context_vocabs):
        assert 1 <= int(b.context_ids[:, c].min()) and int(b.context_ids[:, c].max()) < vocab
    assert b.negative_ids.shape == (w.num_negatives,)
    # Each sample's targets are its inputs shifted by one.
    for start, end in zip(b.offsets[:-1].tolist(), b.offsets[1:].tolist()):
        assert torch.equal(b.item_ids[start + 1:end], b.targets[start:end - 1])


def test_lengths_follow_the_spec_and_are_clipped_to_max_seq_len():
    assert SyntheticBatches(workload(lengths="fixed:9"), 0).global_batch(0).lengths.eq(9).all()
    clipped = SyntheticBatches(workload(lengths="fixed:100", max_seq_len=50), 0).global_batch(0)
    assert clipped.lengths.eq(50).all()


def test_items_follow_the_popularity_spec():
    w = workload(item_vocab=1_000_001, global_batch_size=256, lengths="fixed:200")
    source = SyntheticBatches(w, 0)
    hot = source.popularity.id_of_rank(1, w.item_vocab)
    items = source.global_batch(0).item_ids
    # zipf:1.0 over 1e6 items gives rank 1 about 1/H(1e6) = 6.9% of all draws.
    assert float((items == int(hot)).double().mean()) == pytest.approx(0.069, abs=0.01)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_contiguous_split_across_ranks_concatenates_back_to_the_global_batch(world_size):
    b = SyntheticBatches(workload(global_batch_size=10), seed=2).global_batch(1)
    parts = [b.contiguous_slice(r, world_size) for r in range(world_size)]
    assert sum(p.batch_size for p in parts) == b.batch_size
    assert all(p.global_num_targets == b.global_num_targets for p in parts)
    for name in ("item_ids", "targets", "lengths", "user_ids", "context_ids"):
        assert torch.equal(torch.cat([getattr(p, name) for p in parts]), getattr(b, name))
    assert all(torch.equal(p.negative_ids, b.negative_ids) for p in parts)
    assert_same(b.select(list(range(b.batch_size))), b)


def test_make_batch_source_gives_synthetic_batches_for_synthetic_data():
    assert isinstance(make_batch_source(workload(), 0), SyntheticBatches)


def test_negative_seed_or_step_is_rejected():
    with pytest.raises(ConfigError, match="seed=-1"):
        SyntheticBatches(workload(), seed=-1).global_batch(0)
    with pytest.raises(ConfigError, match="step=-2"):
        SyntheticBatches(workload(), seed=0).global_batch(-2)

