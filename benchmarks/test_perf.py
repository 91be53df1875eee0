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
