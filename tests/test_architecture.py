"""Architectural rules, as tests: fsbench/ is cut into groups by concern, the groups are
layers (a module imports only its own group, the shared leaves and the groups below), and
fsbench never imports the trainers built on it."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

# Asserts nothing a test running beside it can move: the dist tier runs it two at a time.
pytestmark = pytest.mark.parallel_safe

FSBENCH = Path(__file__).resolve().parents[1] / "fsbench"

# Bottom to top. "" is the top level: the shared leaf types (config, specs, errors,
# options), the table renderer every group prints with, the statistics (pure numpy)
# that gates and reports share, and atomic file writes (files). The cost model sits below
# running (a rank reads its fit; the balancer, the emulation and the simulator too), the
# quality study above it (it starts runs).
LAYERS = ["", "measurement", "workloads", "models", "training", "costmodel", "running",
          "quality", "scaling", "reporting", "gates", "cli"]
TOP_LEVEL = {"__init__", "config", "config_io", "specs", "errors", "options", "columns", "table", "stats",
             "files"}
# Whole packages whose modules import each other (function-level imports included): no
# import circle may join them either.
PACKAGES = ("fsbench", "freescale_impl", "baselines")
MAX_LINES = 400


def group_of(module: str) -> str:
    """'fsbench.running.launch.local' -> 'running'; 'fsbench.config' -> ''."""
    parts = module.split(".")[1:]
    return parts[0] if parts and parts[0] in LAYERS[1:] else ""


def module_name(path: Path) -> str:
    rel = path.relative_to(FSBENCH.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every fsbench module `path` imports, at any depth (function-level imports count)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fsbench"):
            found.add(node.module)
            # `from fsbench.running import store`: the module is fsbench.running.store
            for alias in node.names:
                sub = FSBENCH.parent / (node.module + "." + alias.name).replace(".", "/")
                if sub.with_suffix(".py").exists() or sub.is_dir():
                    found.add(node.module + "." + alias.name)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("fsbench")}
    return found


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in FSBENCH.rglob("*.py")}


def test_every_import_points_down_the_layers():
    upward = []
    for name, path in modules().items():
        mine = LAYERS.index(group_of(name))
        for target in imports_of(path):
            theirs = group_of(target)
            if target == "fsbench":
                continue  # the package itself: __version__
            if LAYERS.index(theirs) > mine:
                upward.append(f"{name} -> {target}")
    assert not upward, "imports pointing up the layers:\n" + "\n".join(sorted(upward))


def test_the_top_level_holds_only_shared_leaves_and_every_group_says_what_it_owns():
    top = {p.stem for p in FSBENCH.glob("*.py")}
    assert top <= TOP_LEVEL, top - TOP_LEVEL
    groups = {p.name for p in FSBENCH.iterdir() if (p / "__init__.py").exists()}
    assert groups == set(LAYERS[1:]), groups ^ set(LAYERS[1:])
    for group in groups:
        doc = ast.get_docstring(ast.parse((FSBENCH / group / "__init__.py").read_text()))
        assert doc and "import" in doc, f"fsbench/{group}/__init__.py must say what it owns and imports"


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of PACKAGES it imports, at any depth."""
    root = FSBENCH.parent
    mods = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            rel = path.relative_to(root).with_suffix("")
            mods[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    graph = {}
    for name, path in mods.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
                for alias in node.names:  # `from pkg import mod` names a module, else a member
                    full = f"{node.module}.{alias.name}"
                    found.add(full if full in mods else node.module)
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name in mods}
        graph[name] = {m for m in found if m in mods and m != name}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                circles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_no_import_circle_is_left():
    """Two modules that import each other (at any depth, function-level imports included)
    are one module in two files: neither can be read, tested or moved alone."""
    circles = import_circles(import_graph())
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_the_circle_finder_finds_a_circle():
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []


def test_no_module_is_over_400_lines():
    sizes = {str(p.relative_to(FSBENCH)): len(p.read_text().splitlines()) for p in FSBENCH.rglob("*.py")}
    too_long = {m: n for m, n in sizes.items() if n > MAX_LINES}
    assert not too_long, f"over {MAX_LINES} lines (split along a seam): {too_long}"


def test_importing_fsbench_imports_no_trainer_or_framework():
    code = (
        "import sys, fsbench, fsbench.cli, fsbench.config, fsbench.measurement.metrics, "
        "fsbench.running.runner, fsbench.running.store, fsbench.measurement.timeline, "
        "fsbench.training.trainer, fsbench.workloads, fsbench.models, fsbench.workloads.presets, "
        "fsbench.reporting.report, fsbench.reporting.trace, fsbench.measurement.monitor, "
        "fsbench.costmodel.calibrate, fsbench.running.groundtruth, fsbench.running.overhead, "
        "fsbench.training.dp, fsbench.gates.gate, fsbench.scaling.simulate\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('torchrec', 'deepspeed', 'freescale_impl', 'baselines', 'fbgemm_gpu')]\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.dist  # a fresh interpreter: what a rank imports, nothing this session loaded
def test_a_ranks_imports_leave_pandas_out():
    """A rank imports the worker and its trainer; pandas (the analysis side) costs some 60 MB
    of every rank's memory, so no module on that path may import it (the sm_free transport
    once did, through the Kineto analysis: ranks' peak RSS +12.6% in `fsbench gate`)."""
    code = ("import sys, fsbench.running.launch.worker, freescale_impl.trainer, baselines.ddp; "
            "print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
