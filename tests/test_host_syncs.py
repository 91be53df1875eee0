"""Host syncs per step (fsbench.measurement.host_syncs): counted from torch's sync debug
mode warnings, by the spans open when each fired. The CUDA calls are a GPU's; here the
mode switch is a stand-in and the warnings are raised by hand, with torch's text."""
import warnings

import pandas as pd
import pytest
import torch

from fsbench.measurement.host_syncs import SYNC_WARNING, HostSyncCounter, per_step
from fsbench.measurement.timeline import Timeline


def test_syncs_are_counted_by_the_spans_open_and_other_warnings_pass(monkeypatch):
    modes = []
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    timeline = Timeline(None)
    counter = HostSyncCounter(True, timeline.open_spans)
    text = f"Warning: {SYNC_WARNING} (function operator())"
    with timeline.span("step"):
        with counter.step() as counts:
            warnings.warn(text)  # before the forward: routing, say
            with timeline.span("forward"), timeline.span("emb.lookup", kind="compute"):
                for _ in range(2):  # one call site, two syncs: both count
                    warnings.warn(text)
            with timeline.span("backward"):
                warnings.warn(text)
            with pytest.warns(UserWarning, match="unrelated"):
                warnings.warn("unrelated")  # not a sync: shown as usual, not counted
        assert modes == ["warn", 0]  # the debug mode restored after the trainer's part
    assert counts == {"host_syncs": 4, "host_syncs_fwd_bwd": 3}
    assert timeline.open_spans() == []


def test_cpu_runs_count_nothing():
    with HostSyncCounter(False, lambda: []).step() as counts:
        pass
    assert counts is None
    assert per_step(pd.DataFrame({"rank": [0], "step": [1]})) == {
        "host_syncs_per_step": None, "host_syncs_fwd_bwd_per_step": None}


def test_the_summary_takes_the_busiest_ranks_mean():
    stats = pd.DataFrame({"rank": [0, 0, 1, 1], "step": [2, 3, 2, 3],
                          "host_syncs": [4, 6, 1, 1], "host_syncs_fwd_bwd": [0, 2, 0, 0]})
    assert per_step(stats) == {"host_syncs_per_step": 5.0, "host_syncs_fwd_bwd_per_step": 1.0}
