"""A rank's encoder as the simulator books it (fsbench.scaling.sim_costs.Costs.encoder_passes):
one pass a sub-batch, cut as the trainer cuts its steps (fsbench.training.sub_batch_cut);
each pass takes the longer of its kernels and its launches, and only the kernels are busy."""
import numpy as np
import pytest

from fsbench.scaling.sim_costs import Costs
from fsbench.scaling.sim_inputs import CLUSTERS
from fsbench.training.sub_batch_cut import sub_batch_bounds
from fsbench.workloads.presets import get_workload

H100 = CLUSTERS["h100"]


def costs() -> Costs:
    return Costs(H100, get_workload("medium"), "unused")  # a GPU preset reads no store


def test_kernels_do_not_depend_on_the_cut_and_each_pass_pays_its_launches():
    c = costs()
    launch = c.launch_ms()
    assert launch == pytest.approx(H100.layer_overhead_ms * get_workload("medium").model.num_layers)
    lengths = np.array([5, 900, 40, 40, 300, 12, 7, 1000])
    sample_ms = c.sample_ms(lengths)
    for passes in (1, 2, 4, 8):
        kernels, device = c.encoder_passes(sample_ms, lengths, passes)
        assert kernels == pytest.approx(sample_ms.sum())  # no batch terms without a fit
        bounds = sub_batch_bounds(lengths, passes)
        per_pass = [sample_ms[a:b].sum() for a, b in zip(bounds[:-1], bounds[1:])]
        assert device == pytest.approx(sum(max(k, launch) for k in per_pass))
        assert device >= max(kernels, passes * launch)


def test_an_empty_sub_batch_beyond_the_first_runs_no_pass():
    """With fewer samples than sub-batches the trainer skips the empty ones; a rank with no
    sample still runs the first (DDP needs a loss of every parameter)."""
    c = costs()
    lengths = np.array([30, 30])
    _, device = c.encoder_passes(c.sample_ms(lengths), lengths, 4)
    assert device == pytest.approx(2 * c.launch_ms())  # two passes, launch-bound
    empty = np.array([], dtype=np.int64)
    assert c.encoder_passes(c.sample_ms(empty), empty, 4) == (0.0, pytest.approx(c.launch_ms()))


def test_the_cut_is_the_trainers():
    from freescale_impl.exchange_plan import sub_batch_bounds as trainers

    assert trainers is sub_batch_bounds


def test_a_growing_cut_gives_each_sub_batch_its_share_of_the_tokens():
    """Each sub-batch `growth` times the one before: on 150 equal samples, 4 sub-batches at
    growth 2 take 1/15, 2/15, 4/15 and 8/15 of them; growth 1 is the equal cut."""
    ones = np.ones(150)
    assert list(sub_batch_bounds(ones, 4, 2.0)) == [0, 10, 30, 70, 150]
    assert list(sub_batch_bounds(ones, 3, 1.0)) == [0, 50, 100, 150]
    assert list(sub_batch_bounds(np.ones(3), 4, 2.0)) == [0, 1, 2, 3, 3]  # one a sample, empty last
    # the trainer's expected shares follow the same cut
    from freescale_impl.exchange_plan import expected_sub_batches
    from fsbench.scaling.simulate import scaled_workload

    w = scaled_workload(get_workload("medium"), 64, "weak", 150)
    tokens, rows = expected_sub_batches(w, 64, 4, 2.0)
    assert np.allclose(tokens, [1 / 15, 2 / 15, 4 / 15, 8 / 15], atol=0.01)
    assert sum(rows) == pytest.approx(1.0)
