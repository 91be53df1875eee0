"""Training: the trainer protocol and the pieces every trainer shares.

Owns the `Trainer` protocol and the trainer registry (`trainer`), process groups (`dist`),
the DDP reference trainer (`dp`), the optimizers of tables and dense part (`optim`,
`rowwise_adagrad`) and the input stage (`inputs`:
the loader that prefetches a step's batch). Trainers in `baselines/` and `freescale_impl/`
build on this group.

May import: the top-level leaves, measurement, workloads, models.
"""
