"""Quality: does a trainer train as well as the baseline, not only as fast?

Owns `fsbench quality`'s study (`convergence`: every trainer trained epoch by epoch on real
data to convergence, then held against DDP's model: the same losses, an equivalent test
HR@10) and the float-rounding probe that tells a real difference of losses from the
rounding every trainer's own summation order gives (`rounding_probe`), and time to quality
(`time_to_quality`: training time and samples until validation NDCG@10 reaches a fraction of
the baseline's best; pure, which the report reads too). A rank's own
HR@10/NDCG@10 (`--eval`) is part of the run: fsbench.training.evaluate.

May import: the top-level leaves, measurement, workloads, models, training, costmodel,
running.
"""
