"""Scaling: from measured runs to world sizes this machine cannot run.

Owns the collective cost fits (`commcal`), DDP's gradient buckets (`ddp_buckets`), the
calibrated simulator (`simulate`), the per-step overhead fit (`step_overhead`) and the
micro-benchmarks (`micro`).

May import: the top-level leaves and every group below it (measurement .. running).
"""
