"""Reading nccl-tests output (github.com/NVIDIA/nccl-tests, any 2.x version): the logs that
every GPU cluster's owners run, which `fsbench calibrate --comm --from-nccl-tests` fits and
`fsbench cluster --compare` holds the cluster models against.

A log holds one or more tests. Each starts with a `# nThread ... minBytes ...` header, lists
every rank's device (`#  Rank  3 Group  0 Pid 123 on node-07 device  3 [0x..] NVIDIA H100
...`), from which the world size and the GPUs per node come, then a column header whose
names place the out-of-place and in-place time, algbw and busbw (older versions have no
`root` column and say `error` where newer ones say `#wrong`), then one row per message
size. Which collective a test ran comes from its `Collective test starting:` line (newer
versions), else from the file's name (`all_reduce_perf.log`), else from a `NAME=PATH`
argument. Lines prefixed by a launcher (`[1,0]<stdout>:`, `srun: `, `0: `, timestamps)
are read too.
"""
from __future__ import annotations

import dataclasses
import re
from collections import Counter
from pathlib import Path

from fsbench.errors import ConfigError

# nccl-tests binary -> the collective's name here (the simulator's names where it uses them)
COLLECTIVES = {"all_reduce": "all_reduce", "alltoall": "all_to_all", "all_gather": "all_gather",
               "reduce_scatter": "reduce_scatter", "sendrecv": "sendrecv"}
# How many times its buffer a rank moves, per byte of the size column, in nccl-tests'
# busbw (its doc/PERFORMANCE.md): busbw = algbw * factor.
BUS_FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
               "all_gather": lambda n: (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
               "sendrecv": lambda n: 1.0}

# A launcher's prefix: Open MPI --tag-output `[1,0]<stdout>:`, srun -l ` 0: `, `srun: `,
# a bracketed timestamp.
_PREFIX = re.compile(r"^\s*(\[\d+,\d+\]<std(out|err)>:|\d+:(?!\d)|srun:|\[[^\]]*\d\d:\d\d[^\]]*\])\s?")
# A device line; versions before 2.13.4 have no Group.
_RANK = re.compile(r"#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)")
_NUMBER = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$")
_STARTING = re.compile(r"Collective test starting:\s*(\w+?)(_perf)?\b")
_VERSION = re.compile(r"nccl-tests version\s+(\S+)(?:\s+nccl-headers=(\d+))?")
# A command line or launcher echo that names the binary: `./build/alltoall_perf -b 8 ...`
_BINARY = re.compile(r"\b(all_reduce|alltoall|all_gather|reduce_scatter|sendrecv)_perf\b")
_NCCL = re.compile(r"NCCL version\s+(\d+\.\d+\.\d+)")


@dataclasses.dataclass(frozen=True)
class NcclTestsPoint:
    """One row of one test: a message size and its out-of-place time (the in-place one
    where out-of-place is missing)."""
    collective: str
    world_size: int
    gpus_per_node: int
    bytes: int
    time_us: float
    busbw_gbs: float
    source: str  # the log's path and line number


@dataclasses.dataclass(frozen=True)
class NcclTestsRun:
    """One test of a log: its collective, ranks, hosts and rows."""
    collective: str
    world_size: int
    hosts: int
    gpus_per_node: int
    points: tuple[NcclTestsPoint, ...]
    path: str
    nccl_version: str | None = None
    tests_version: str | None = None


def _collective_from_name(text: str) -> str | None:
    """The collective that a binary's or file's name names (all_reduce_perf, alltoall...)."""
    low = text.lower().replace("-", "_")
    for name in sorted(COLLECTIVES, key=len, reverse=True):
        if name in low or name.replace("_", "") in low.replace("_", ""):
            return COLLECTIVES[name]
    return None


def _clean(line: str) -> str:
    """A line without a launcher's prefix (MPI --tag-output, srun -l, timestamps)."""
    for _ in range(3):
        stripped = _PREFIX.sub("", line, count=1)
        if stripped == line:
            break
        line = stripped
    return line.rstrip("\n")


def parse_log(spec: str | Path) -> list[NcclTestsRun]:
    """Every test in one nccl-tests log. `spec`: a path, or COLLECTIVE=PATH where neither
    the log nor its file name says which collective ran (COLLECTIVE: all_reduce, alltoall,
    all_gather, reduce_scatter, sendrecv). A one-line ConfigError where the file cannot be
    read or holds no test."""
    spec = str(spec)
    forced = None
    head, eq, tail = spec.partition("=")
    if eq and head in {*COLLECTIVES, *COLLECTIVES.values()}:
        forced, spec = COLLECTIVES.get(head, head), tail
    path = Path(spec)
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as e:
        raise ConfigError(f"nccl-tests log {spec}: cannot read it ({e.strerror})") from None
    runs: list[NcclTestsRun] = []
    state: dict = {}
    nccl_version = tests_version = None
    named = None

    def finish() -> None:
        if state.get("rows"):
            runs.append(_run_of(state, path, forced or named or _collective_from_name(path.name),
                                nccl_version, tests_version))
        state.clear()

    for number, raw in enumerate(lines, 1):
        line = _clean(raw)
        if m := _VERSION.search(line):
            tests_version = m.group(1)
            if m.group(2) and not nccl_version:  # major*10000 + minor*100 + patch
                code = int(m.group(2))
                nccl_version = f"{code // 10000}.{code // 100 % 100}.{code % 100}"
        if m := _NCCL.search(line):
            nccl_version = m.group(1)
        if m := _STARTING.search(line):
            finish()
            named = _collective_from_name(m.group(1))
            continue
        if (m := _BINARY.search(line)) and not line.lstrip().startswith("#"):
            named = _collective_from_name(m.group(1))  # the command that ran it
        if line.startswith("#") and "nThread" in line and "minBytes" in line:
            finish()
            state.update(ranks={}, rows=[], columns=None)
            continue
        if not state:
            continue
        if m := _RANK.match(line.strip()):
            state["ranks"][int(m.group(1))] = m.group(2)
            continue
        if line.lstrip().startswith("#") and "size" in line and "time" in line and "busbw" in line:
            state["columns"] = line.lstrip("# ").split()
            continue
        if state.get("columns") and line.strip() and not line.lstrip().startswith("#"):
            row = _row(line, state["columns"])
            if row is not None:
                state["rows"].append((*row, number))
    finish()
    if not runs:
        raise ConfigError(f"nccl-tests log {spec}: no test found (expected a '# nThread ... minBytes' "
                          f"header, the '#  Rank' device lines, a column header and data rows)")
    return runs


def _row(line: str, columns: list[str]) -> tuple[int, float, float] | None:
    """(size in bytes, time in us, busbw GB/s) of a data row: the out-of-place columns, else
    the in-place ones; None for a line that is not a data row.

    Read from the left: size, count, type, then the redop (a word; empty in very old
    alltoall rows, which then lose that field) and, where the header has one, the root;
    then time, algbw, busbw, as the header places them (the in-place half as far after
    the out-of-place one as in the header: -I 1 adds per-iteration columns between).
    Trailing columns (a -S 1 timestamp, two words) change nothing."""
    fields = line.split()
    if len(fields) < 6 or not fields[0].isdigit() or not fields[1].isdigit():
        return None
    i = 3
    while i < len(fields) and not _NUMBER.match(fields[i]):
        i += 1  # the redop
    if "root" in columns and i < len(fields) and re.fullmatch(r"-?\d+", fields[i]):
        i += 1
    times = [k for k, c in enumerate(columns) if c == "time"]
    buses = [k for k, c in enumerate(columns) if c == "busbw"]
    for t, b in zip(times, buses):
        at, bus_at = i + t - times[0], i + b - times[0]
        try:
            time_us, busbw = float(fields[at]), float(fields[bus_at])
        except (ValueError, IndexError):
            continue
        if time_us > 0:
            return int(fields[0]), time_us, busbw
    return None


def _run_of(state: dict, path: Path, collective: str | None, nccl_version, tests_version) -> NcclTestsRun:
    where = f"nccl-tests log {path}"
    if collective is None:
        raise ConfigError(f"{where}: which collective it ran is not said (no 'Collective test "
                          f"starting' line, no collective in the file name): give it as "
                          f"COLLECTIVE=PATH with COLLECTIVE one of {', '.join(COLLECTIVES)}")
    ranks: dict[int, str] = state["ranks"]
    if not ranks:
        raise ConfigError(f"{where}: no '#  Rank N Group G Pid P on HOST device D' lines, so its "
                          f"world size and GPUs per node are unknown")
    world = max(ranks) + 1
    per_host = Counter(ranks.values())
    gpn = max(per_host.values())
    if len(set(per_host.values())) > 1:
        raise ConfigError(f"{where}: hosts hold different numbers of ranks ({dict(per_host)}): "
                          f"the model needs GPUs per node to be one number")
    points = tuple(NcclTestsPoint(collective, world, gpn, size, time_us, busbw, f"{path}:{line}")
                   for size, time_us, busbw, line in state["rows"])
    return NcclTestsRun(collective, world, len(per_host), gpn, points, str(path),
                        nccl_version, tests_version)


def read_logs(specs: list[str | Path]) -> list[NcclTestsRun]:
    """Every test of every log (parse_log), in the order given."""
    if not specs:
        raise ConfigError("--from-nccl-tests / --compare: give one or more nccl-tests logs")
    return [run for spec in specs for run in parse_log(spec)]
