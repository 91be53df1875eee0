"""The scheduler's view of this process: how long threads waited for a CPU (Linux
schedstat), what its threads and its descendants (loader workers) used, and the machine's
CPU steal. What `contended` is decided from (fsbench.measurement.metrics); where the files
do not exist the answers are 0 per span (`runqueue_wait_ns`) or None (unknown, never 0)."""
from __future__ import annotations

import os
import threading

_SCHEDSTAT: dict[int, int] = {}  # native thread id -> open fd of its schedstat


def runqueue_wait_ns() -> int:
    """Nanoseconds the calling thread has spent runnable but waiting for a CPU (Linux
    schedstat); 0 where that file does not exist. One pread of an open fd (~2 us)."""
    tid = threading.get_native_id()
    fd = _SCHEDSTAT.get(tid)
    if fd is None:
        try:
            fd = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
        except OSError:
            fd = -1
        _SCHEDSTAT[tid] = fd
    if fd < 0:
        return 0
    try:
        return int(os.pread(fd, 128, 0).split()[1])
    except (OSError, IndexError, ValueError):
        return 0


PROC = "/proc"


def threads_schedstat() -> dict[int, tuple[int, int]] | None:
    """(CPU ns, run-queue wait ns) so far of every thread of this process and of its
    descendant processes (loader workers), by thread id: gloo's threads and a loader wait
    for a CPU too, and a neighbour can take it from them alone. None where schedstat does
    not exist. A thread that ended is gone from /proc, and its times with it."""
    import psutil

    pids = [os.getpid()]
    try:
        pids += [c.pid for c in psutil.Process().children(recursive=True)]
    except psutil.Error:
        pass
    out: dict[int, tuple[int, int]] = {}
    for pid in pids:
        try:
            tids = os.listdir(f"{PROC}/{pid}/task")
        except OSError:  # no /proc, or the process just ended
            continue
        for tid in tids:
            try:
                with open(f"{PROC}/{pid}/task/{tid}/schedstat") as f:
                    cpu, wait = f.read().split()[:2]
                out[int(tid)] = (int(cpu), int(wait))
            except (OSError, ValueError):
                continue
    return out or None  # not even this thread's: no schedstat here


def threads_since(before: dict[int, tuple[int, int]] | None,
                  after: dict[int, tuple[int, int]] | None) -> tuple[int, int] | None:
    """Between two `threads_schedstat` readings taken by the compute thread: (run-queue
    wait of every thread, CPU time of every thread but the calling one: the helpers').
    A thread born in between counts whole; None without schedstat."""
    if before is None or after is None:
        return None
    me = threading.get_native_id()
    wait = helper_cpu = 0
    for tid, (cpu, waited) in after.items():
        cpu0, wait0 = before.get(tid, (0, 0))
        wait += max(waited - wait0, 0)
        if tid != me:
            helper_cpu += max(cpu - cpu0, 0)
    return wait, helper_cpu


def cpu_steal_ticks() -> tuple[int, int]:
    """(steal, total) clock ticks of the whole machine (Linux /proc/stat): time the
    hypervisor ran something else on our virtual CPUs. Invisible to the run-queue wait
    and to thread CPU time, it stretches wall time only. (0, 0) where unavailable."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    steal = fields[7] if len(fields) > 7 else 0
    return steal, sum(fields[:8])
