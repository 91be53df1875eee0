"""Scaling: from measured runs to world sizes this machine cannot run.

Owns the collective cost fits (`commcal`), DDP's gradient buckets (`ddp_buckets`), the
calibrated simulator (`simulate`) and what it is told (`sim_inputs`: trainer profiles,
clusters and which of their figures are assumed), how a headline moves with those
assumptions (`sensitivity`), the per-step overhead fit (`step_overhead`) and the
micro-benchmarks (`micro`).

May import: the top-level leaves and every group below it (measurement .. running).
"""
