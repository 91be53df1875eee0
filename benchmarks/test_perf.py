"""pytest-benchmark suite: the same code paths as the asv suite, for CI gates.

    pytest benchmarks --benchmark-autosave                 # record a baseline
    pytest benchmarks --benchmark-compare --benchmark-compare-fail=median:10%

Not collected by the unit-test run (testpaths = tests); nothing here asserts a time:
the comparison against a saved baseline is the gate.
"""
import numpy as np
import pytest

from benchmarks.bench_asv import _costs


@pytest.mark.parametrize("partitioner", ["lpt", "karmarkar_karp"])
def test_plan_8192_samples_onto_256_ranks(benchmark, partitioner):
    from freescale_impl import partition

    fn = getattr(partition, partitioner)
    costs = _costs("movielens-100k", 8192)
    plan = benchmark(fn, costs, 256)
    assert sorted(np.concatenate(plan.assignment).tolist()) == list(range(8192))


@pytest.mark.parametrize("partitioner", ["lpt", "karmarkar_karp"])
def test_plan_32768_samples_onto_256_ranks(benchmark, partitioner):
    """The cluster-scale size `fsbench micro planner --samples 32768 --ranks 256` times: a
    256-GPU batch at 128 samples per GPU."""
    from freescale_impl import partition

    costs = _costs("movielens-100k", 32768)
    plan = benchmark(getattr(partition, partitioner), costs, 256)
    assert plan.ratio_to_bound < 1.05


def test_plan_window_of_4_batches_of_32768_onto_256_ranks(benchmark):
    from freescale_impl.window import lookahead_window

    batches = [_costs("movielens-100k", 32768, seed=k) for k in range(4)]
    steps = benchmark(lookahead_window, batches, 256, 4)
    assert len(steps) == 4


def test_small_global_batch_generation(benchmark):
    from fsbench.workloads import make_batch_source
    from fsbench.workloads.presets import small

    source = make_batch_source(small(), seed=0)
    batch = benchmark(source.global_batch, 1)
    assert batch.batch_size == small().global_batch_size


def test_small_forward_backward(benchmark):
    import torch

    from fsbench.models import build_model
    from fsbench.workloads import make_batch_source
    from fsbench.workloads.presets import small

    torch.set_num_threads(1)
    model = build_model(small(), seed=0)
    batch = make_batch_source(small(), seed=0).global_batch(0)

    def step():
        model(batch).backward()
        model.zero_grad(set_to_none=True)

    benchmark.pedantic(step, rounds=5, warmup_rounds=1)
