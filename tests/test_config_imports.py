"""Building a config is light and acyclic: `fsbench.config` checks its specs with
`fsbench.specs` (standard library only), never with `fsbench.workloads`, so it imports
neither numpy nor torch, and the error messages stay what they were."""
import ast
import pathlib
import subprocess
import sys

import pytest

import fsbench
from fsbench import errors, specs
from fsbench.config import ConfigError, WorkloadConfig

PKG = pathlib.Path(fsbench.__file__).parent

LENGTHS_ALLOWED = (
    "allowed: a preset (amazon-beauty, yelp, movielens-100k, movielens-1m, movielens-20m, "
    "otto-sessions, kuairand-1k) or fixed:L, uniform:LO-HI, "
    "lognormal:mu=..,sigma=..[,shift=..,min=..,max=..,mode=truncate|clip], "
    "powerlaw:alpha=..,xmin=..[,scale=..][,shift=..], hist:PATH (a length_bin,count CSV)")


def _run(code: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_building_a_workload_config_imports_neither_torch_nor_numpy(tmp_path):
    hist = tmp_path / "lengths.csv"
    hist.write_text("length_bin,count\n3,2\n8,1\n")
    _run(
        "import dataclasses, sys\n"
        "from fsbench.config import WorkloadConfig\n"
        "from fsbench.workloads.presets import WORKLOADS, small\n"
        "w = WorkloadConfig(name='t', lengths='yelp', popularity='zipf:1.0')\n"
        "dataclasses.replace(small(), lengths='lognormal:mu=2,sigma=1,min=4', "
        "popularity='zipf:0.8')\n"
        f"dataclasses.replace(small(), lengths='hist:{hist}')\n"
        "[make() for make in WORKLOADS.values()]\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy'))\n"
        "assert not heavy, heavy[:5]\n"
        "loaded = [m for m in sys.modules if m.startswith('fsbench.workloads.')]\n"
        "assert loaded == ['fsbench.workloads.presets'], loaded\n"
    )


def test_importing_config_imports_no_workloads_module():
    _run(
        "import sys, fsbench.config, fsbench.specs, fsbench.errors\n"
        "bad = [m for m in sys.modules if m.startswith('fsbench.workloads') "
        "or m.split('.')[0] in ('torch', 'numpy')]\n"
        "assert not bad, bad\n"
    )


def _fsbench_imports(path: pathlib.Path) -> set[str]:
    """Every fsbench module a source file imports, at any depth (function bodies too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "fsbench"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "fsbench":
                out |= {f"fsbench.{a.name}" for a in node.names}
            elif node.module.startswith("fsbench."):
                out.add(node.module)
    return out


def _all_imports(path: pathlib.Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


def test_import_graph_has_no_config_workloads_cycle():
    assert _fsbench_imports(PKG / "errors.py") == set()
    assert _fsbench_imports(PKG / "specs.py") == {"fsbench.errors"}
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    assert _all_imports(PKG / "specs.py") - stdlib == {"fsbench"}
    assert _all_imports(PKG / "errors.py") - stdlib == set()
    config_imports = _fsbench_imports(PKG / "config.py")
    assert not {m for m in config_imports if m.startswith("fsbench.workloads")}, config_imports
    assert config_imports <= {"fsbench.specs", "fsbench.errors"}


def test_config_error_is_one_class_everywhere():
    from fsbench.workloads import distributions, generator, popularity, presets, realdata

    assert ConfigError is errors.ConfigError and issubclass(ConfigError, ValueError)
    for module in (distributions, generator, popularity, presets, realdata, specs):
        assert getattr(module, "ConfigError", ConfigError) is ConfigError


@pytest.mark.parametrize("field, value, message", [
    ("lengths", "fixed:0", f"lengths='fixed:0': L=0 must be >= 1; {LENGTHS_ALLOWED}"),
    ("lengths", "gamma:k=2", f"lengths='gamma:k=2': unknown kind 'gamma'; {LENGTHS_ALLOWED}"),
    ("lengths", "lognormal:mu=1,sigma=1,min=9,max=3",
     f"lengths='lognormal:mu=1,sigma=1,min=9,max=3': min=9 must be <= max=3; {LENGTHS_ALLOWED}"),
    ("lengths", "lognormal:mu=0,sigma=0.1,min=100000",
     "lengths='lognormal:mu=0,sigma=0.1,min=100000': min/max leave no probability mass to "
     f"truncate to; {LENGTHS_ALLOWED}"),
    ("lengths", "hist:/no/such/file.csv",
     "lengths='hist:/no/such/file.csv': cannot use /no/such/file.csv: No such file or directory"),
    ("popularity", "zipf:0", "popularity='zipf:0': S=0 must be a finite number > 0; "
     "allowed: zipf:S with S > 0 (e.g. zipf:1.0)"),
    ("popularity", "uniform", "popularity='uniform': unknown form; "
     "allowed: zipf:S with S > 0 (e.g. zipf:1.0)"),
    ("data", "foo:bar", "data='foo:bar': unknown kind 'foo'; "
     "allowed: synthetic, sasrec:PATH, recbole:PATH, otto:PATH"),
    ("data", "sasrec:/no/file", "data='sasrec:/no/file': no such file '/no/file'; "
     "allowed: synthetic, sasrec:PATH, recbole:PATH, otto:PATH"),
])
def test_bad_spec_raises_the_same_config_error_from_config_specs_and_workloads(
        field, value, message):
    from fsbench.workloads import parse_data_spec, parse_length_spec, parse_popularity_spec

    parsers = {"lengths": (specs.parse_lengths, parse_length_spec),
               "popularity": (specs.parse_popularity, parse_popularity_spec),
               "data": (specs.parse_data, parse_data_spec)}[field]
    with pytest.raises(ConfigError) as err:
        WorkloadConfig(name="t", **{field: value})
    assert str(err.value) == message
    for parse in parsers:
        with pytest.raises(ConfigError) as err:
            parse(value)
        assert str(err.value) == message


def test_malformed_hist_csv_is_rejected_by_config_with_its_line(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("length_bin,count\n3,one\n")
    with pytest.raises(ConfigError) as err:
        WorkloadConfig(name="t", lengths=f"hist:{path}")
    assert str(err.value) == (f"lengths='hist:{path}': cannot use {path}: "
                              "line 2 is not 'length_bin,count': '3,one'")


def test_workloads_build_their_objects_from_the_parsed_specs(tmp_path):
    from fsbench.workloads import (
        LENGTH_PRESETS,
        DataSpec,
        FixedLength,
        HistogramLength,
        LogNormalLength,
        PowerLawLength,
        UniformLength,
        ZipfPopularity,
        parse_data_spec,
        parse_length_spec,
        parse_popularity_spec,
    )

    assert list(LENGTH_PRESETS) == list(specs.LENGTH_PRESET_SPECS)
    for name, preset in LENGTH_PRESETS.items():
        table = specs.LENGTH_PRESET_SPECS[name]
        d, t = preset.distribution, table.distribution
        assert (d.mu, d.sigma, d.shift, d.min, d.max, d.mode) == (
            t.mu, t.sigma, t.shift, t.min, t.max, t.mode)
        assert (preset.median, preset.p90, preset.source) == (table.median, table.p90,
                                                               table.source)
        assert specs.parse_lengths(name) is table
        assert parse_length_spec(name) is d
    assert parse_length_spec("fixed:7") == FixedLength(7)
    assert parse_length_spec("uniform:3-9") == UniformLength(3, 9)
    assert parse_length_spec("powerlaw:alpha=2.5,xmin=6") == PowerLawLength(2.5, 6)
    assert parse_length_spec("lognormal:mu=2,sigma=1,min=4,mode=clip") == LogNormalLength(
        mu=2.0, sigma=1.0, shift=0.0, min=4, max=None, mode="clip")
    path = tmp_path / "h.csv"
    path.write_text("length_bin,count\n3,1\n9,3\n")
    parsed = specs.parse_lengths(f"hist:{path}")
    assert (parsed.kind, parsed.path, parsed.bins, parsed.counts) == (
        "hist", str(path), (3, 9), (1.0, 3.0))
    hist = parse_length_spec(f"hist:{path}")
    assert isinstance(hist, HistogramLength) and hist.cdf.tolist() == [0.25, 1.0]
    assert parse_popularity_spec("zipf:1.25") == ZipfPopularity(1.25)
    assert specs.parse_popularity("zipf:1.25") == specs.ZipfSpec(1.25)
    assert parse_data_spec("synthetic") == specs.parse_data("synthetic") == DataSpec("synthetic")


def test_workloads_package_members_load_on_first_use():
    _run(
        "import sys\n"
        "import fsbench.workloads as w\n"
        "assert 'torch' not in sys.modules\n"
        "from fsbench.workloads import make_batch_source, JaggedBatch, contiguous_split, "
        "SyntheticBatches, RealDataBatches, LENGTH_PRESETS, parse_length_spec\n"
        "assert 'torch' in sys.modules\n"
        "from fsbench.workloads import *\n"
        "assert set(w.__all__) <= set(dir(w))\n"
        "try:\n"
        "    w.no_such_member\n"
        "except AttributeError:\n"
        "    pass\n"
        "else:\n"
        "    raise SystemExit('expected AttributeError')\n"
    )
