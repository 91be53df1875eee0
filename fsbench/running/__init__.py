"""Running: starting ranks, running a config, storing what it measured.

Owns the launchers (`launch`: local processes, torchrun, the per-rank worker), one run
end to end (`runner`: launch, then the run's summary in one pass), the store of runs
(`store`), turn-taking between two versions (`pacing`), memory estimates and peaks
(`memory`), quality beside speed (`evaluate`), this machine's cost fit (`calibrate`), and
the checks that start runs: closed-form truth (`groundtruth`) and the harness's own
overhead (`overhead`).

May import: the top-level leaves, measurement, workloads, models, training.
"""
