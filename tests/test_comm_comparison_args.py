"""scripts/comm_comparison.py's lists: variant names and workloads' values hold commas of
their own, so its default --variants (every variant, comma-joined) failed to parse, and a
workload with two distribution parameters split in two (2026-12-07)."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("comm_comparison", ROOT / "scripts" / "comm_comparison.py")
cc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cc)


_variants, _workloads = cc.variant_list, cc.workload_list


def test_the_default_variants_parse_back_to_every_variant():
    assert _variants(",".join(cc.VARIANTS)) == list(cc.VARIANTS)
    assert _variants("ddp, freescale (all on, chunks=4),torchrec") == [
        "ddp", "freescale (all on, chunks=4)", "torchrec"]


def test_a_workload_keeps_the_commas_of_its_values():
    assert _workloads("comm-heavy,small+lengths=lognormal:mu=2.4,sigma=0.8,small+amazon-beauty") == [
        "comm-heavy", "small+lengths=lognormal:mu=2.4,sigma=0.8", "small+amazon-beauty"]
