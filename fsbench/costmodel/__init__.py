"""The cost model: what one rank's step costs on this machine, measured.

Owns cost(L) (`cost_curve`), a batch's terms beyond its samples (`batch_terms`), the
stored fit that the FreeScale balancer, the emulation and the simulator read (`fit`), the
measurements it is made of (`timing`, and `corun`: ranks sharing a host's cores) and the
procedure behind `fsbench calibrate` (`calibrate`). It sits below running: a rank reads a
fit (compute=emulated), it never starts runs.

May import: the top-level leaves, measurement, workloads, models, training.
"""
