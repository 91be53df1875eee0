"""Running: starting ranks, running a config, storing what it measured.

Owns the launchers (`launch`: local processes, torchrun, the per-rank worker), one run
end to end (`runner`: launch, then the run's summary in one pass), the store of runs
(`store`) and where commands may write (`output_paths`), turn-taking between two versions
(`pacing`), the memory estimate of a run before it starts (`memory`), and the checks
that start runs: closed-form truth (`groundtruth`) and the harness's own overhead
(`overhead`). The cost fit a rank reads lives below (fsbench.costmodel), the quality study
above (fsbench.quality).

May import: the top-level leaves, measurement, workloads, models, training, costmodel.
"""
