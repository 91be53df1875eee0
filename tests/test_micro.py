"""`fsbench micro sm-contention`: the arithmetic on synthetic timings, the record, argument
checks, the no-GPU exit, and the measuring loop against a CPU stand-in for torch.cuda."""
import contextlib
import json
import math
import subprocess
import sys
import time
import types

import pytest
import torch

from fsbench.scaling import micro
from fsbench.cli import main

NO_CUDA = not torch.cuda.is_available()


# --- arithmetic ---------------------------------------------------------------------

def test_tflops_and_bandwidth_from_milliseconds():
    # 2 * 8192^3 = 1.0995e12 flops in 1.5 ms -> 733 TFLOP/s
    assert micro.gemm_tflops(8192, 1.5) == pytest.approx(2 * 8192 ** 3 / 1.5e-3 / 1e12)
    assert micro.gemm_tflops(1000, 2.0) == pytest.approx(1.0)   # 2e9 flops in 2 ms
    assert micro.gb_per_s(256 * 2**20, 0.1) == pytest.approx(2684.35456)


def test_copies_per_gemm_covers_the_gemm_with_margin():
    assert micro.copies_per_gemm(1.6, 0.13) == math.ceil(2.0 * 1.6 / 0.13)  # 25
    assert micro.copies_per_gemm(1.6, 5.0) == 1      # one slow copy outlasts a GEMM
    assert micro.copies_per_gemm(1.0, 1.0, margin=3) == 3
    assert micro.copies_per_gemm(1.0, 0.0) == 2000   # a copy too short to time: 1 us


def test_overlap_fraction_and_bandwidth_within_the_window():
    window = (10.0, 20.0)
    copies = [(8.0, 11.0), (11.0, 14.0), (14.0, 17.0), (18.0, 21.0)]  # gap 17-18
    assert micro.overlap_fraction(copies, window) == pytest.approx(0.9)
    assert micro.overlap_fraction(copies, (5.0, 5.0)) == 0.0
    assert micro.overlap_fraction([(0.0, 100.0)], window) == 1.0
    # only the two copies wholly inside: 2 x 3e6 bytes in 6 ms = 1 GB/s
    assert micro.copy_gb_per_s_within(3_000_000, copies, window) == pytest.approx(1.0)
    assert micro.copy_gb_per_s_within(3_000_000, [(0.0, 100.0)], window) is None


def _synthetic_record():
    alone = ([1.0, 1.1, 0.9], [1.0, 1.0, 1.0])           # median 1.0 ms
    gemm = [(10.0, 11.2), (11.2, 12.4), (12.4, 13.6)]    # 1.2 ms each
    copies = [(9.0 + 0.5 * i, 9.5 + 0.5 * i) for i in range(12)]  # 9.0 .. 15.0, busy
    # SM utilization read while each copy ran alone: the same-GPU copy's 0.62 refutes its
    # "copy engine" claim; the pinned host-to-device copy reads 0.
    beside = {"sm_copy": {"gemm": gemm, "copies": copies, "copy_alone_ms": [0.4, 0.4, 0.5], "sm_util": 0.9},
              "ce_d2d": {"gemm": gemm, "copies": copies, "copy_alone_ms": [0.1], "sm_util": 0.62},
              "ce_h2d": {"gemm": gemm[:2], "copies": [(10.0, 11.0)], "copy_alone_ms": [2.0], "sm_util": 0.0}}
    meta = {"device": "Fake GPU", "torch": "0.0"}
    return micro.build_record(meta, 1000, 4_000_000, 3, alone, beside)


def test_record_holds_slowdowns_tflops_and_bandwidths():
    r = _synthetic_record()
    assert r["benchmark"] == "sm-contention" and r["device"] == "Fake GPU"
    assert (r["gemm_size"], r["copy_bytes"], r["repeats"], r["warmup"]) == (1000, 4_000_000, 3, 3)
    alone, sm, h2d = (r["conditions"][k] for k in ("alone", "sm_copy", "ce_h2d"))
    assert alone["gemm_ms_median"] == 1.0 and alone["slowdown"] == 1.0
    assert alone["gemm_tflops"] == pytest.approx(2.0)
    assert sm["gemm_ms_median"] == pytest.approx(1.2)
    assert sm["slowdown"] == pytest.approx(1.2)
    assert sm["gemm_tflops"] == pytest.approx(2.0 / 1.2)
    assert sm["moved_by"] == "SM" and h2d["moved_by"] == "copy engine"
    assert sm["copy_gb_per_s_alone"] == pytest.approx(4_000_000 / 0.4e6)   # 10 GB/s
    assert sm["copy_gb_per_s_beside_gemm"] == pytest.approx(8.0)          # 0.5 ms per copy
    assert sm["overlap"] == 1.0 and sm["copies_queued"] == 12
    assert h2d["overlap"] == pytest.approx(1.0 / 2.4)
    assert r["alone_drift"] == pytest.approx(1.0)
    json.dumps(r)  # storable as is


def test_a_copy_is_labelled_by_the_sm_utilization_read_while_it_ran_alone():
    """ce_d2d (a same-GPU copy_) is a copy engine's by its call, but at 0.62 SM utilization
    alone it ran on SMs: labelled so, with the claim beside it, and the table says what
    that means. Without a reading the claim stays, marked unverified (before: every
    copy was labelled by its name alone)."""
    r = _synthetic_record()
    d2d, h2d = r["conditions"]["ce_d2d"], r["conditions"]["ce_h2d"]
    assert (d2d["moved_by"], d2d["moved_by_claimed"], d2d["copy_sm_util_alone"]) == ("SM", "copy engine", 0.62)
    assert (h2d["moved_by"], h2d["copy_sm_util_reason"]) == ("copy engine", None)
    assert "note: ce_d2d moved its bytes on SM" in micro.format_table(r)
    assert "note: ce_h2d" not in micro.format_table(r)
    blind = micro.moved_by("ce_d2d", None, "GPM not supported on Tesla T4")
    assert blind["moved_by"] == "copy engine (unverified)"
    assert blind["copy_sm_util_reason"] == "GPM not supported on Tesla T4"


def test_table_shows_every_condition_and_warns_about_uncovered_gemms():
    table = micro.format_table(_synthetic_record())
    for text in ("alone", "sm_copy", "ce_h2d", "1.200x", "| condition", "Fake GPU"):
        assert text in table
    assert "did not cover the GEMMs in ce_h2d" in table
    assert "sm_copy" not in table.split("warning")[1]


def test_record_is_written_as_json_under_out(tmp_path):
    path = micro.write_record(_synthetic_record(), tmp_path)
    assert path.parent == tmp_path and path.name.startswith("sm-contention-")
    assert json.loads(path.read_text())["conditions"]["sm_copy"]["slowdown"] == pytest.approx(1.2)


# --- the command line ---------------------------------------------------------------

@pytest.mark.parametrize("flags, expected", [
    (["--gemm-size", "-1"], "--gemm-size=-1 must be >= 1"),
    (["--gemm-size=0"], "--gemm-size=0 must be >= 1"),
    (["--bytes", "-4"], "--bytes=-4 must be a positive multiple of 4"),
    (["--bytes", "1001"], "--bytes=1001 must be a positive multiple of 4"),
    (["--repeats", "0"], "--repeats=0 must be >= 1"),
])
def test_bad_sizes_get_one_line_naming_the_field_and_exit_2(flags, expected, tmp_path, capsys):
    assert main(["micro", "sm-contention", *flags, "--out", str(tmp_path / "m")]) == 2
    captured = capsys.readouterr()
    assert expected in captured.err and len(captured.err.strip().splitlines()) == 1
    assert captured.out == ""
    assert not (tmp_path / "m").exists()


@pytest.mark.skipif(not NO_CUDA, reason="a CUDA device is visible")
def test_without_cuda_one_line_and_exit_2(tmp_path):
    out = tmp_path / "micro"
    proc = subprocess.run([sys.executable, "-m", "fsbench.cli", "micro", "sm-contention",
                           "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA GPU" in lines[0] and "cannot run" in lines[0], lines
    assert not out.exists()


def test_help_says_what_it_measures(capsys):
    with pytest.raises(SystemExit) as e:
        main(["micro", "sm-contention", "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for words in ("bf16 GEMM", "SMs", "copy-engine", "--gemm-size", "--bytes", "--repeats"):
        assert words in text


# --- the measuring loop, against a CPU stand-in for torch.cuda ----------------------
# Ops run synchronously on CPU; an "event" stamps the wall clock when recorded. This
# checks the bookkeeping (rounds, warm-up, intervals, conditions) and that measure()
# calls only what it should; it cannot check any GPU behaviour.

class _Event:
    def __init__(self, enable_timing=False):
        assert enable_timing
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def elapsed_time(self, end):
        assert self.t is not None and end.t is not None, "event never recorded"
        return (end.t - self.t) * 1e3


class _Stream:
    def __init__(self, device=None):
        self.device = device
        self.waited = []

    def wait_event(self, event):
        assert event.t is not None, "waiting on an event that was never recorded"
        self.waited.append(event)


def _fake_torch():
    streams = {}
    cuda = types.SimpleNamespace(
        Event=_Event, Stream=_Stream,
        current_stream=lambda device=None: streams.setdefault(device, _Stream(device)),
        stream=lambda s: contextlib.nullcontext(),
        synchronize=lambda device=None: None,
        device_count=lambda: 1,
        can_device_access_peer=lambda a, b: False,
        get_device_name=lambda device=None: "CPU stand-in",
        get_device_properties=lambda device=None: types.SimpleNamespace(multi_processor_count=0),
    )
    fake = types.SimpleNamespace(cuda=cuda)
    for name in ("randn", "empty_like", "matmul", "add", "device", "bfloat16", "version",
                 "__version__"):
        setattr(fake, name, getattr(torch, name))
    fake.empty = lambda *size, pin_memory=False, **kw: torch.empty(*size, **kw)
    return fake


def test_timeline_queues_rounds_and_returns_ordered_intervals():
    fake, side = _fake_torch(), _Stream("cpu")
    ran = []
    gemms, copies = micro.timeline(fake, side, 4, gemm=lambda: ran.append("g"),
                                   copy=lambda: ran.append("c"), copies_per_round=2)
    assert ran == ["c", "c", "g"] * 4
    assert len(gemms) == 4 and len(copies) == 8 and len(side.waited) == 1
    assert all(0 <= s <= e for s, e in gemms + copies)
    assert gemms[0][0] >= copies[1][1]  # on CPU, the round's copies ran first
    only_copies = micro.timeline(fake, side, 3, copy=lambda: None)
    assert only_copies[0] == [] and len(only_copies[1]) == 3


def test_measure_on_a_stand_in_runs_every_condition_and_builds_a_record():
    fake = _fake_torch()
    record = micro.sm_contention(fake, 64, 4096, 2, device="cpu")
    assert list(record["conditions"]) == ["alone", "sm_copy", "ce_d2d", "ce_h2d"]
    # no GPU, no GPM: every copy keeps its claim, marked unverified, with NVML's reason
    for kind in ("sm_copy", "ce_d2d", "ce_h2d"):
        c = record["conditions"][kind]
        assert c["moved_by"].endswith("(unverified)") and c["copy_sm_util_reason"], c
    assert len(record["conditions"]["alone"]["gemm_ms"]) == 4      # 2 first + 2 last
    for kind, c in record["conditions"].items():
        assert len(c["gemm_ms"]) == (4 if kind == "alone" else 2)
        assert c["gemm_tflops"] > 0 and c["slowdown"] > 0
    assert record["device"] == "CPU stand-in" and record["copy_bytes"] == 4096
    micro.format_table(record)


@pytest.mark.gpu
@pytest.mark.skipif(NO_CUDA, reason="needs CUDA")
def test_sm_contention_runs_on_a_gpu(tmp_path, capsys):
    code = main(["micro", "sm-contention", "--gemm-size", "2048", "--bytes", str(16 * 2**20),
                 "--repeats", "3", "--out", str(tmp_path)])
    assert code == 0
    record = json.loads(next(tmp_path.glob("sm-contention-*.json")).read_text())
    assert {"alone", "sm_copy", "ce_d2d", "ce_h2d"} <= set(record["conditions"])
    for c in record["conditions"].values():
        assert c["gemm_tflops"] > 0
    h2d = record["conditions"]["ce_h2d"]
    if h2d["copy_sm_util_alone"] is not None:  # where GPM reads: the DMA control holds
        assert h2d["moved_by"] == "copy engine", h2d
        assert record["conditions"]["sm_copy"]["moved_by"] == "SM"
    assert "| condition" in capsys.readouterr().out
