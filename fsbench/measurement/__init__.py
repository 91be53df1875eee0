"""Measurement: what a step's time is made of, from spans and monitors to the ratios.

Owns the clocks (`clock`), the span timeline each rank writes (`timeline`), collectives in
flight (`flights`), the per-step metrics and their one definition (`metrics`), a run's
summary in one pass over what its ranks wrote (`run_summary`), the machine monitors
(`monitor`: CPU, schedstat contention; `nvml`: one GPU through NVML), host syncs per step
on CUDA (`host_syncs`), the Kineto trace reader (`kineto`) and the speed probe. Pure functions over tidy frames where it can be.

May import: the shared leaves at fsbench's top level only. Everything else imports it.
"""
