"""Training: the trainer protocol and the pieces every trainer shares.

Owns the `Trainer` protocol and the trainer registry (`trainer`), process groups (`dist`),
the DDP reference trainer (`dp`), the optimizers of tables and dense part (`optim`,
`rowwise_adagrad`), the input stage (`inputs`: the loader that prefetches a step's
batch), what a rank does with `--eval`: HR@10 and NDCG@10 of the model every trainer hands
over through `trained_model()` (`evaluate`), the rule that no child process outlives
its parent (`lifetime`), and processes forked warm from one server (`warm_start`). Trainers in `baselines/` and `freescale_impl/`
build on this group.

May import: the top-level leaves, measurement, workloads, models.
"""
