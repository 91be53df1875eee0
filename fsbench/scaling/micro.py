"""Micro-benchmarks on one GPU. `fsbench micro sm-contention`: does communication that is
overlapped with compute steal the GPU's SMs?

NOT YET RUN ON A GPU. Written on a machine without one: the arithmetic, the record and the
control flow are unit-tested on CPU (tests/test_micro.py, with a stand-in for torch.cuda);
the GPU numbers are unchecked until a run on a GPU confirms them.

What it measures. A large bf16 GEMM (n x n x n, cuBLAS on tensor cores) is timed with CUDA
events, one GEMM at a time, warm-up rounds discarded, median of the timed ones, in these
conditions:

    alone     nothing else runs (measured first and again last: `alone_drift` shows
              whether clocks changed in between)
    sm_copy   beside `torch.add(src, 0, out=dst)` on a second stream: an elementwise
              kernel whose thread blocks, resident on SMs, load and store every byte, the
              way NCCL's kernels move data. It competes for SMs and for memory bandwidth.
    ce_d2d    beside `dst.copy_(src)` of contiguous same-dtype device buffers: PyTorch
              issues cudaMemcpyAsync device-to-device. Whether the driver runs it on a
              copy engine or on SMs is not documented; at ~3 TB/s on an H100 (90% of HBM
              bandwidth, more than copy engines are known to give) probably SMs. Its
              label comes from the measurement below, not from its name.
    ce_h2d    beside `dst.copy_(pinned_host, non_blocking=True)`: a host-to-device DMA
              over PCIe on a copy engine; it competes for neither much.
    ce_peer   (two GPUs with peer access only) beside `peer_dst.copy_(src)` to GPU 1: a
              peer DMA on a copy engine.

Each copy moves `--bytes`. Beside a GEMM the copies are queued ahead (COVER_MARGIN times
the work a GEMM's duration needs), so a copy is in flight during every timed GEMM;
`overlap` is the share of the timed GEMMs' span during which one was, measured from the
copies' own events. `slowdown` = median GEMM time beside the copies / median GEMM time
alone (1.00: no effect). Copy bandwidth is bytes copied per second (each byte is read once
and written once), alone and while beside the GEMMs.

What moves each copy's bytes is measured, not assumed: NVML GPM SM utilization sampled
while the copy runs alone (fsbench.measurement.copy_engines), about 0 on a copy engine.
`moved_by` is that verdict ("SM", "copy engine"), or the claim of COPIES marked
unverified where GPM gave no reading (`moved_by_claimed`, `copy_sm_util_alone` and
`copy_sm_util_reason` beside it); the table notes a copy whose verdict refutes its claim.

Reading it: sm_copy slower than a copy-engine copy means the SM copy takes SMs from the
GEMM; a copy engine's near 1.00 means memory-bandwidth contention alone costs little.
ce_h2d is the case that certainly uses a copy engine (its verdict checks the method).
"""
from __future__ import annotations

import datetime
import math
import secrets
import socket
import statistics
from pathlib import Path

from fsbench.errors import ConfigError

SCHEMA_VERSION = 1
WARMUP = 3            # rounds run but not timed, per condition
COVER_MARGIN = 2.0    # copy work queued per GEMM, in GEMM durations measured alone
MIN_OVERLAP = 0.95    # below this the table says the copies did not cover the GEMMs
MAX_DRIFT = 0.03      # |alone last / alone first - 1| above this: the table warns

COPIES = {  # name: (what moves the bytes, the call and why it runs there)
    "sm_copy": ("SM", "torch.add(src, 0, out=dst): an elementwise kernel; its thread blocks "
                      "on the SMs load and store every byte"),
    "ce_d2d": ("copy engine", "dst.copy_(src), contiguous, same device: cudaMemcpyAsync "
                              "device-to-device; the driver picks copy engine or SMs"),
    "ce_h2d": ("copy engine", "dst.copy_(pinned_host_src, non_blocking=True): "
                              "cudaMemcpyAsync host-to-device over PCIe, a copy engine"),
    "ce_peer": ("copy engine", "peer_dst.copy_(src) to GPU 1 (peer access): cudaMemcpyAsync "
                               "peer-to-peer, a copy engine"),
}


# ---------------------------------------------------------------------------
# Arithmetic: pure functions of timings (milliseconds), testable without a GPU.

def check_args(gemm_size: int, nbytes: int, repeats: int) -> None:
    """Bad sizes: one line naming the flag (ConfigError)."""
    if gemm_size < 1:
        raise ConfigError(f"--gemm-size={gemm_size} must be >= 1")
    if nbytes < 4 or nbytes % 4:
        raise ConfigError(f"--bytes={nbytes} must be a positive multiple of 4 "
                          "(the copies move float32 buffers)")
    if repeats < 1:
        raise ConfigError(f"--repeats={repeats} must be >= 1")


def gemm_tflops(n: int, ms: float) -> float:
    """TFLOP/s of one n x n x n GEMM (2 n^3 flops) that took `ms` milliseconds."""
    return 2 * n ** 3 / (ms * 1e9)


def gb_per_s(nbytes: float, ms: float) -> float:
    return nbytes / (ms * 1e6)


def durations(intervals: list[tuple[float, float]]) -> list[float]:
    return [end - start for start, end in intervals]


def copies_per_gemm(gemm_ms: float, copy_ms: float, margin: float = COVER_MARGIN) -> int:
    """Copies to queue per GEMM so that copy work outlasts the GEMMs by `margin` (a copy
    is taken to last at least 1 us: event resolution)."""
    return max(1, math.ceil(margin * gemm_ms / max(copy_ms, 1e-3)))


def overlap_fraction(copies: list[tuple[float, float]], window: tuple[float, float]) -> float:
    """Share of `window` during which a copy was in flight (copies on one stream do not
    overlap one another, so their overlaps with the window add up)."""
    start, end = window
    if end <= start:
        return 0.0
    busy = sum(max(0.0, min(e, end) - max(s, start)) for s, e in copies)
    return min(1.0, busy / (end - start))


def copy_gb_per_s_within(nbytes: int, copies: list[tuple[float, float]],
                         window: tuple[float, float]) -> float | None:
    """Bandwidth of the copies that ran wholly inside `window` (None if none did)."""
    inside = [e - s for s, e in copies if s >= window[0] and e <= window[1]]
    return gb_per_s(nbytes * len(inside), sum(inside)) if inside else None


def build_record(meta: dict, n: int, nbytes: int, repeats: int,
                 alone: tuple[list[float], list[float]], beside: dict[str, dict]) -> dict:
    """The stored record. `alone`: timed GEMM ms measured first and last; `beside[kind]`:
    {"gemm": timed GEMM (start, end) ms, "copies": every queued copy's (start, end) ms on
    the same clock, "copy_alone_ms": timed copy ms with nothing else running}."""
    first, last = alone
    alone_ms = statistics.median(first + last)
    conditions = {"alone": {"moved_by": None, "copy": None,
                            "gemm_ms_median": alone_ms, "gemm_tflops": gemm_tflops(n, alone_ms),
                            "slowdown": 1.0, "gemm_ms": first + last}}
    for kind, m in beside.items():
        gemm_ms = durations(m["gemm"])
        median = statistics.median(gemm_ms)
        window = (m["gemm"][0][0], m["gemm"][-1][1])
        conditions[kind] = {
            **moved_by(kind, m.get("sm_util"), m.get("sm_util_reason")), "copy": COPIES[kind][1],
            "gemm_ms_median": median, "gemm_tflops": gemm_tflops(n, median),
            "slowdown": median / alone_ms,
            "copy_gb_per_s_alone": gb_per_s(nbytes, statistics.median(m["copy_alone_ms"])),
            "copy_gb_per_s_beside_gemm": copy_gb_per_s_within(nbytes, m["copies"], window),
            "overlap": overlap_fraction(m["copies"], window),
            "copies_queued": len(m["copies"]),
            "gemm_ms": gemm_ms,
        }
    return {"benchmark": "sm-contention", "schema_version": SCHEMA_VERSION, **meta,
            "gemm_size": n, "gemm_dtype": "bfloat16", "gemm_flops": 2 * n ** 3,
            "copy_bytes": nbytes, "repeats": repeats, "warmup": WARMUP,
            "alone_drift": statistics.median(last) / statistics.median(first),
            "conditions": conditions}


def moved_by(kind: str, sm_util: float | None, reason: str | None) -> dict:
    """A copy's label from GPM SM utilization read while it ran alone (copy_engines.verdict),
    beside the claim of COPIES; the claim, marked unverified, where there is no reading."""
    from fsbench.measurement.copy_engines import verdict

    claimed = COPIES[kind][0]
    found = verdict(sm_util)
    return {"moved_by": found if sm_util is not None else f"{claimed} (unverified)",
            "moved_by_claimed": claimed, "copy_sm_util_alone": sm_util,
            "copy_sm_util_reason": None if sm_util is not None else reason or "not measured"}


def format_table(record: dict) -> str:
    """Markdown table of the record, with a line on how to read it and any warnings."""
    def num(value, fmt):
        return "n/a" if value is None else format(value, fmt)

    def copy_num(c, key, fmt):  # the GEMM alone has no copy: "-"
        return num(c[key], fmt) if key in c else "-"

    from fsbench.table import grid

    rows = []
    for kind, c in record["conditions"].items():
        rows.append([kind, c["moved_by"] or "-", num(c["gemm_ms_median"], ".3f"),
                     num(c["gemm_tflops"], ".1f"), num(c["slowdown"], ".3f") + "x",
                     copy_num(c, "copy_gb_per_s_alone", ".0f"),
                     copy_num(c, "copy_gb_per_s_beside_gemm", ".0f"),
                     copy_num(c, "overlap", ".0%")])
    out = [f"{record['device']}: {record['gemm_size']}^3 bf16 GEMM, copies of "
           f"{record['copy_bytes'] / 2**20:g} MiB, median of {record['repeats']}",
           grid(["condition", "copy by", "GEMM ms", "TFLOP/s", "slowdown", "copy GB/s alone",
                 "copy GB/s beside", "overlap"], rows, align=["left", "left", *["right"] * 6]),
           "slowdown = GEMM time beside the copies / alone (1.000x: no effect); overlap = "
           "share of the timed GEMMs' span with a copy in flight"]
    short = [k for k, c in record["conditions"].items() if c.get("overlap", 1.0) < MIN_OVERLAP]
    if short:
        out.append(f"warning: copies did not cover the GEMMs in {', '.join(short)}: "
                   "that slowdown understates the effect (use larger --bytes)")
    for kind, c in record["conditions"].items():
        if c.get("copy_sm_util_alone") is not None and c["moved_by"] != c["moved_by_claimed"]:
            out.append(f"note: {kind} moved its bytes on {c['moved_by']} (GPM SM util "
                       f"{c['copy_sm_util_alone']:.2f} alone), not on {c['moved_by_claimed']}: "
                       "its slowdown is that of a copy on " + c["moved_by"])
    if abs(record["alone_drift"] - 1) > MAX_DRIFT:
        out.append(f"warning: the GEMM alone ran {record['alone_drift']:.3f}x as long at the "
                   "end as at the start (clocks changed): compare slowdowns with care")
    return "\n".join(out)


def write_record(record: dict, out_dir: str | Path) -> Path:
    from fsbench.running.store import write_json_atomic

    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = Path(out_dir) / f"sm-contention-{stamp}-{secrets.token_hex(2)}.json"
    write_json_atomic(path, record)
    return path


# ---------------------------------------------------------------------------
# Measurement: needs a CUDA device (the torch module and the device are passed in, so
# the tests can run it against a stand-in for torch.cuda on CPU).

def _timed(event, stream, op) -> tuple:
    start, end = event(), event()
    start.record(stream)
    op()
    end.record(stream)
    return start, end


def timeline(torch, side, rounds: int, gemm=None, copy=None, copies_per_round: int = 1):
    """Queue `rounds` rounds, each `copies_per_round` copies on stream `side` and then one
    GEMM on the current stream, with a CUDA event before and after every op; wait for all
    of it. Returns (GEMM intervals, copy intervals), (start, end) in ms from one origin."""
    cuda = torch.cuda
    event = lambda: cuda.Event(enable_timing=True)  # noqa: E731
    compute = cuda.current_stream(side.device)  # where ops on side.device's tensors run
    origin = event()
    origin.record(compute)
    side.wait_event(origin)  # copies start once the buffers made on `compute` are ready
    gemms, copies = [], []
    for _ in range(rounds):
        if copy is not None:
            with cuda.stream(side):
                copies += [_timed(event, side, copy) for _ in range(copies_per_round)]
        if gemm is not None:
            gemms.append(_timed(event, compute, gemm))
    cuda.synchronize(side.device)
    since = lambda pair: (origin.elapsed_time(pair[0]), origin.elapsed_time(pair[1]))  # noqa: E731
    return [since(p) for p in gemms], [since(p) for p in copies]


def copy_ops(torch, device, nbytes: int) -> dict:
    """The copies of COPIES that this machine can do, as zero-argument callables."""
    cuda = torch.cuda
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    host = torch.empty(nbytes // 4, pin_memory=True)  # pinned: DMA, no staging copy
    ops = {"sm_copy": lambda: torch.add(src, 0, out=dst),
           "ce_d2d": lambda: dst.copy_(src),
           "ce_h2d": lambda: dst.copy_(host, non_blocking=True)}
    index = torch.device(device).index or 0
    peer = 1 if index == 0 else 0
    if cuda.device_count() > 1 and cuda.can_device_access_peer(index, peer):
        peer_dst = torch.empty(nbytes // 4, device=torch.device("cuda", peer))
        ops["ce_peer"] = lambda: peer_dst.copy_(src)  # runs on src's current stream
    return ops


def measure(torch, device, n: int, nbytes: int, repeats: int, sm_util=None):
    """Time the GEMM alone, beside each copy, and alone again; read SM utilization while
    each copy runs alone (`sm_util(op)` -> (fraction or None, why); default: GPM through
    fsbench.measurement.copy_engines). Returns the arguments of build_record after meta:
    (alone, beside)."""
    if sm_util is None:
        from fsbench.measurement.copy_engines import sm_util_while

        sm_util = lambda op: sm_util_while(torch.device(device), op)  # noqa: E731
    cuda = torch.cuda
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    c = torch.empty_like(a)
    gemm = lambda: torch.matmul(a, b, out=c)  # noqa: E731
    ops = copy_ops(torch, device, nbytes)
    side = cuda.Stream(device=device)
    rounds = WARMUP + repeats

    def gemm_alone() -> list[float]:
        return durations(timeline(torch, side, rounds, gemm=gemm)[0][WARMUP:])

    first = gemm_alone()
    beside = {}
    for kind, copy in ops.items():
        copy_ms = durations(timeline(torch, side, rounds, copy=copy)[1][WARMUP:])
        k = copies_per_gemm(statistics.median(first), statistics.median(copy_ms))
        gemms, copies = timeline(torch, side, rounds, gemm=gemm, copy=copy, copies_per_round=k)
        util, why = sm_util(copy)
        beside[kind] = {"gemm": gemms[WARMUP:], "copies": copies, "copy_alone_ms": copy_ms,
                        "sm_util": util, "sm_util_reason": why}
    return (first, gemm_alone()), beside


def device_meta(torch, device) -> dict:
    from fsbench.running.store import git_sha

    props = torch.cuda.get_device_properties(device)
    return {"created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "device": torch.cuda.get_device_name(device), "sm_count": props.multi_processor_count,
            "gpus": torch.cuda.device_count(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "hostname": socket.gethostname(), "git_sha": git_sha()}


def sm_contention(torch, n: int, nbytes: int, repeats: int, device="cuda:0") -> dict:
    """Run the benchmark on `device`; the record (see build_record)."""
    check_args(n, nbytes, repeats)
    meta = device_meta(torch, device)
    alone, beside = measure(torch, device, n, nbytes, repeats)
    return build_record(meta, n, nbytes, repeats, alone, beside)
