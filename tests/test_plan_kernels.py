"""The compiled planner (freescale_impl.plan_kernels) makes the python planner's plans.

Every rank plans alone from the same inputs, so the two paths must agree exactly: the same
assignment arrays and loads bit for bit, whichever path a rank takes (a machine without
numba plans in Python). The compiled comparisons are skipped where numba is missing; the
fallback tests run everywhere. Timing is measured by `fsbench micro planner`, not here.
"""
import importlib.util
import subprocess
import sys

import numpy as np
import pytest

from freescale_impl import partition, plan_kernels, window
from freescale_impl.partition import best_of, karmarkar_karp, lpt
from freescale_impl.window import lookahead_window

HAVE_NUMBA = importlib.util.find_spec("numba") is not None
needs_numba = pytest.mark.skipif(not HAVE_NUMBA, reason="numba is not installed: the "
                                 "compiled planner is optional, the python one plans")
PARTITIONERS = {"lpt": lpt, "kk": karmarkar_karp, "best_of": best_of}


def assert_same(a: partition.Plan, b: partition.Plan) -> None:
    assert (a.method, a.max_cost, len(a.assignment)) == (b.method, b.max_cost, len(b.assignment))
    for x, y in zip(a.assignment, b.assignment):
        assert x.dtype == y.dtype == np.int64 and np.array_equal(x, y)
    assert a.loads.dtype == b.loads.dtype == np.float64
    assert a.loads.tobytes() == b.loads.tobytes()  # bit for bit


def both(monkeypatch, fn, *args, **kw):
    """fn's result on the python path, then on the compiled one."""
    monkeypatch.setenv(plan_kernels.ENV, "python")
    slow = fn(*args, **kw)
    monkeypatch.setenv(plan_kernels.ENV, "compiled")
    return slow, fn(*args, **kw)


def cases(seed: int, count: int):
    """(costs, ranks): integer lengths through a quadratic (many exact ties), heavy tails,
    zeros (and -0.0), one value, tiny and huge values, N = 1 and N > samples."""
    rng = np.random.default_rng(seed)
    for t in range(count):
        m = int(rng.integers(0, 40)) if t % 4 == 0 else int(rng.integers(40, 5000))
        n = [1, 2, 3, 16, 256, 1024, m + 7][t % 7]
        lengths = np.minimum(np.rint(4 + np.exp(0.94 + 1.29 * rng.standard_normal(m))), 1024)
        c = [3.0 * 96 * lengths ** 2 + 46 * 96 * lengths,  # an analytical cost model's shape
             rng.lognormal(3, 1.5, m),
             np.floor(rng.uniform(0, 4, m)),  # a quarter zeros
             np.where(rng.random(m) < 0.5, -0.0, rng.integers(1, 4, m) * 0.1),
             np.full(m, 7.0),
             rng.choice([5e-324, 1e-300, 1.0, 1e300], m)][t % 6]
        yield np.asarray(c, dtype=np.float64), n


@needs_numba
def test_descending_is_numpys_stable_argsort():
    rng = np.random.default_rng(0)
    arrays = [c for c, _ in cases(1, 60)] + [
        np.empty(0), np.array([2.0]), np.array([0.0, -0.0, 0.0, 3.0, -0.0]),
        rng.random(70_000),  # every mantissa bit varies: the key and index need two arrays
        np.repeat(rng.random(3), 5000)]
    plan_kernels._load()
    for c in arrays:
        np.testing.assert_array_equal(plan_kernels.descending(c), np.argsort(-c, kind="stable"))


@needs_numba
@pytest.mark.parametrize("name", sorted(PARTITIONERS))
def test_compiled_plans_are_the_python_plans(monkeypatch, name):
    methods = set()
    for c, n in cases(2, 80):
        slow, fast = both(monkeypatch, PARTITIONERS[name], c, n)
        assert_same(slow, fast)
        methods.add(fast.method)
    if name == "best_of":  # all three outcomes were compared
        assert methods == {"best_of:kk", "best_of:lpt", "best_of:kk(=lpt)"}


@needs_numba
def test_compiled_plans_at_cluster_scale(monkeypatch):
    rng = np.random.default_rng(3)
    lengths = np.minimum(np.rint(4 + np.exp(0.94 + 1.29 * rng.standard_normal(32768))), 1024)
    c = 3.0 * lengths ** 2 + 5.0 * lengths
    for fn in PARTITIONERS.values():
        assert_same(*both(monkeypatch, fn, c, 256))


@needs_numba
def test_compiled_window_at_cluster_scale(monkeypatch):
    """4 x 32,768 samples onto 256 ranks, whales in every batch: the window re-packs and
    moves samples between steps to keep their sizes (window_kernels), as in Python."""
    rng = np.random.default_rng(5)
    batches = []
    for _ in range(4):
        lengths = np.minimum(np.rint(4 + np.exp(0.94 + 1.29 * rng.standard_normal(32768))), 1024)
        c = 3.0 * lengths ** 2 + 5.0 * lengths
        c[rng.choice(c.size, 2, replace=False)] = 2 * c.sum() / 256
        batches.append(c)
    slow, fast = both(monkeypatch, lookahead_window, batches, 256, 4)
    assert all(s.plan.method == "kk+window4" for s in fast)
    assert len({o for o, _ in fast[0].samples}) > 1  # a step holds samples of several batches
    for a, b in zip(slow, fast):
        assert list(a.samples) == list(b.samples)
        assert_same(a.plan, b.plan)


@needs_numba
@pytest.mark.parametrize("name", sorted(PARTITIONERS))
def test_compiled_window_is_the_python_window(monkeypatch, name):
    rng = np.random.default_rng(4)
    for t in range(12):
        n, window = [2, 16, 64][t % 3], 1 + t % 4
        batches = []
        for _ in range(int(rng.integers(1, 6))):
            c = rng.lognormal(3, 1, int(rng.integers(0, 3000)))
            c[rng.random(c.size) < 0.002] *= 500  # whales: steps change sizes, samples move
            batches.append(np.floor(c) if t % 2 else c)
        slow, fast = both(monkeypatch, lookahead_window, batches, n, window,
                          partitioner=PARTITIONERS[name])
        assert len(slow) == len(fast)
        for a, b in zip(slow, fast):
            assert a.window_start == b.window_start and list(a.samples) == list(b.samples)
            assert_same(a.plan, b.plan)


@needs_numba
def test_auto_compiles_large_batches_only(monkeypatch):
    monkeypatch.delenv(plan_kernels.ENV, raising=False)
    assert not plan_kernels.use(plan_kernels.THRESHOLD - 1)
    assert plan_kernels.use(plan_kernels.THRESHOLD)
    for m in (plan_kernels.THRESHOLD - 1, plan_kernels.THRESHOLD):  # equal on both sides
        c = np.floor(np.random.default_rng(m).lognormal(3, 1, m))
        monkeypatch.delenv(plan_kernels.ENV, raising=False)
        auto = karmarkar_karp(c, 64)
        monkeypatch.setenv(plan_kernels.ENV, "python")
        assert_same(auto, karmarkar_karp(c, 64))


def test_without_numba_the_python_path_plans(monkeypatch):
    monkeypatch.setattr(plan_kernels, "_loaded", False)  # as if `import numba` had failed
    monkeypatch.delenv(plan_kernels.ENV, raising=False)
    c = np.floor(np.random.default_rng(5).lognormal(3, 1, 5000))
    assert not plan_kernels.use(c.size)
    auto = best_of(c, 32)
    monkeypatch.setenv(plan_kernels.ENV, "python")
    assert_same(auto, best_of(c, 32))
    monkeypatch.setenv(plan_kernels.ENV, "compiled")
    with pytest.raises(RuntimeError, match="numba is not installed"):
        lpt(c, 32)
    monkeypatch.setenv(plan_kernels.ENV, "fast")
    with pytest.raises(ValueError, match="expected auto, python or compiled"):
        lpt(c, 32)


def test_without_numba_installed_in_a_fresh_process():
    code = ("import sys; sys.modules['numba'] = None  # `import numba` raises ImportError\n"
            "import numpy as np\n"
            "from freescale_impl.partition import karmarkar_karp\n"
            "from freescale_impl.window import lookahead_window\n"
            "c = np.arange(5000.0) % 97\n"
            "assert karmarkar_karp(c, 16).max_load > 0\n"
            "assert len(lookahead_window([c, c], 8, 2)) == 2\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_small_batches_never_import_numba():
    code = ("import sys, numpy as np\n"
            "from freescale_impl.partition import best_of\n"
            "best_of(np.arange(2000.0), 8)\n"
            "sys.exit(1 if 'numba' in sys.modules else 0)\n")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_cheapest_is_the_head_of_a_stable_argsort():
    rng = np.random.default_rng(6)
    for _ in range(200):
        c = np.floor(rng.uniform(0, 5, int(rng.integers(1, 60)))) * rng.choice([1.0, -0.0])
        s = int(rng.integers(1, c.size + 2))
        np.testing.assert_array_equal(window._cheapest(c, s),
                                      np.argsort(c, kind="stable")[:s])


@needs_numba
def test_the_ci_precompile_compiles_the_planner(monkeypatch, capsys):
    """scripts/compile_planner.py, which .ci/run starts beside the fast tier so that the
    tests above load the kernels, plans in compiled mode and says so (cached by now)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "compile_planner.py"
    spec = importlib.util.spec_from_file_location("compile_planner", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setenv(plan_kernels.ENV, "auto")  # restored after: the script sets "compiled"
    assert script.main() == 0
    assert "kernels compiled in" in capsys.readouterr().out
