"""Processes forked from one warm server instead of started cold.

A cold CPU process spends seconds importing torch (and torch._dynamo, DDP's) before it
does anything it measures; the ranks of a sweep, the co-run calibration's processes and the
tests' own gloo ranks are many such processes on a 2-core machine. multiprocessing's
forkserver, with `WARM_MODULE` as its preload, imports those once per process that uses it
and runs nothing else, so a process forked from it has its imports done and nothing
started: no thread pool, no CUDA context, no process group. fsbench.running.launch.forked
says what that changes for a rank (its environment, its peak RSS, CUDA ranks start cold).
One server serves every user in a process, whichever started it.
"""
from __future__ import annotations

import multiprocessing

# Named, not imported: importing it here would load torch and every trainer's framework
# into each process that imports this module.
WARM_MODULE = "fsbench.running.launch.warm"


def warm_context():
    """multiprocessing's forkserver context, its server preloading `WARM_MODULE` (set
    before the server's first start in this process; later a no-op). Linux and macOS."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([WARM_MODULE])
    return ctx
